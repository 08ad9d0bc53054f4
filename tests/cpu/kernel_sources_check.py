"""The ordering rule of programmatic dependent launch (src/kernels/sm90/grid_dependency.cuh), checked
on the sources: every kernel of the library (__global__ under src/kernels) starts with
wait_for_previous_grid() (unconditional, or under a condition whose other case waits later: the fused
forwards' and the CP corrections' early starts), and none is launched with <<<>>> (launch_kernel sets the attribute).
A kernel launched with the attribute that touched memory before the wait could race the previous
kernel of the stream; one launched with <<<>>> would not overlap at all."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def code(text: str) -> str:
    """The text with // and /* */ comments blanked (line structure kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def main() -> int:
    problems, kernels = [], 0
    for path in sorted((ROOT / "src" / "kernels").rglob("*.cu*")):
        text = code(path.read_text())
        name = path.relative_to(ROOT)
        if "<<<" in text:
            problems.append(f"{name}: a <<<>>> launch (use launch_kernel)")
        for match in re.finditer(r"__global__\b", text):
            body = text.index("{", match.end())  # the body's opening brace (no braces in the signatures)
            signature = text[match.end():body]
            kernel = re.search(r"(\w+)\s*\(", re.sub(r"__launch_bounds__\s*\([^)]*\)", "", signature))
            first = text[body + 1:].lstrip()
            kernels += 1
            if not re.match(r"(if \([^;{]*\) )?wait_for_previous_grid\(\);", first):
                problems.append(f"{name}: kernel {kernel.group(1) if kernel else '?'} does not start with "
                                f"wait_for_previous_grid()")
    for problem in problems:
        print(problem)
    print(f"{kernels} kernels checked, {len(problems)} problems")
    return 1 if problems or kernels == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
