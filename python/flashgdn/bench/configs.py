"""The benchmark tables of DESIGN §5 and how a run selects rows from them (torch-free).

Forward table: FlashQLA's published H200 configurations, 9 (Hqk, Hv) head configurations of the
Qwen3.5/3.6 models x 19 sequence mixes = 171 rows. Backward table: FlashQLA's published backward
configurations, 4 head configurations x 8 token/sequence mixes, each giving a backward-only row
(`bwd`) and a forward+backward row (`fwdbwd`).

Sequence mixes ("seqlens", spelled as in the published table):
    1x32768       one sequence of 32768 tokens (1xLEN)
    8192x4        four sequences of 8192 tokens (LENxCOUNT, LEN > 1)
    28672+4096    the listed lengths
    32k_4seq      32768 tokens cut into 4 sequences at FlashQLA's random cut points
    5000          one sequence of 5000 tokens
"""

from __future__ import annotations

import dataclasses
import re

D = 128   # head dim (K = V)
C = 64    # chunk length

# (model label as published, Hqk, Hv)
FWD_HEADS = [("397B/122B TP8", 2, 8), ("397B/122B TP4", 4, 16), ("397B/122B TP2", 8, 32),
             ("397B/122B TP1", 16, 64), ("35B/9B/4B TP1", 16, 32), ("27B TP2", 8, 24), ("27B TP1", 16, 48),
             ("2B/0.8B TP1", 16, 16), ("Sym h32", 32, 32)]
FWD_MIXES = ["1x32768", "1x16384", "1x8192", "1x4096", "1x2048", "28672+4096", "24576+8192", "16384+16384",
             "8192+24576", "4096+28672", "12288+4096", "6144+2048", "4096+4096", "2048+6144", "1024+7168",
             "8192x4", "4096x8", "2048x4", "1024x8"]
BWD_HEADS = [("hk16_hv32", 16, 32), ("hk8_hv16", 8, 16), ("hk4_hv8", 4, 8), ("hk2_hv4", 2, 4)]
BWD_MIXES = ["8k_1seq", "8k_2seq", "8k_4seq", "8k_8seq", "32k_1seq", "32k_2seq", "32k_4seq", "32k_8seq"]

QUICK_FWD_HEADS = [FWD_HEADS[0], FWD_HEADS[2], FWD_HEADS[4]]
QUICK_FWD_MIXES = ["1x32768", "1x8192", "16384+16384", "8192x4", "1024x8"]
QUICK_BWD_HEADS = [BWD_HEADS[0], BWD_HEADS[2]]
QUICK_BWD_MIXES = ["8k_1seq", "8k_8seq", "32k_1seq", "32k_8seq"]

TABLE_DIRECTIONS = {"fwd": ("fwd",), "bwd": ("bwd", "fwdbwd")}   # table -> the row directions it gives
ROW_DIRECTIONS = ("fwd", "bwd", "fwdbwd")

# FlashQLA's backward cut points (its benchmark: the first n-1 entries of torch.randperm(T-1) from a
# CPU generator seeded 42, plus one, sorted), computed once with torch 2.11 and frozen here so that the
# table is known without torch; flashqla_cuts() recomputes them when torch is present.
FROZEN_CUTS = {
    "8k_2seq": [7053, 1139],
    "8k_4seq": [5809, 1244, 406, 733],
    "8k_8seq": [161, 1928, 3157, 563, 1244, 229, 177, 733],
    "32k_2seq": [7212, 25556],
    "32k_4seq": [7212, 7072, 13725, 4759],
    "32k_8seq": [3274, 1029, 2909, 5061, 2011, 3793, 9932, 4759],
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration of a table: `table` is "fwd" or "bwd" (the backward table gives two rows)."""
    table: str
    model: str
    h_qk: int
    h_v: int
    seqlens: str

    @property
    def lengths(self) -> list[int]:
        return lengths_of(self.seqlens)

    @property
    def label(self) -> str:
        return f"{self.table} ({self.h_qk},{self.h_v}) {self.seqlens}"


def flashqla_cuts(total: int, n: int, seed: int = 42) -> list[int]:
    """Lengths of `total` tokens cut into n sequences the way FlashQLA's backward benchmark cuts them."""
    import torch  # only for mixes outside FROZEN_CUTS

    gen = torch.Generator().manual_seed(seed)
    cuts = sorted((torch.randperm(total - 1, dtype=torch.int32, generator=gen)[: n - 1] + 1).tolist())
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def lengths_of(mix: str) -> list[int]:
    """Sequence lengths of a mix (grammar in the module docstring). ValueError when it does not parse."""
    m = re.fullmatch(r"(\d+)k_(\d+)seq", mix)
    if m:
        total, n = int(m.group(1)) * 1024, int(m.group(2))
        if n < 1 or n > total:
            raise ValueError(f"seqlens {mix!r}: cannot cut {total} tokens into {n} sequences")
        return [total] if n == 1 else list(FROZEN_CUTS.get(mix) or flashqla_cuts(total, n))
    if re.fullmatch(r"\d+(\+\d+)*", mix):
        lengths = [int(x) for x in mix.split("+")]
    elif re.fullmatch(r"\d+x\d+", mix):
        a, b = (int(x) for x in mix.split("x"))
        lengths = [b] if a == 1 else [a] * b
    else:
        raise ValueError(f"seqlens {mix!r}: expected 1xLEN, LENxCOUNT, LEN+LEN+..., Nk_Mseq or LEN")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"seqlens {mix!r}: every sequence needs at least one token")
    return lengths


def parse_filter(text: str) -> dict[str, set[str]]:
    """--filter "key=value[,key=value...]": every key must match; a value may list alternatives a|b.
    Keys: hv, hqk, mix (or seqlens), model, dir (row directions fwd, bwd, fwdbwd)."""
    out: dict[str, set[str]] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        key = {"seqlens": "mix", "h_v": "hv", "h_qk": "hqk", "direction": "dir"}.get(key.strip(), key.strip())
        if not sep or key not in ("hv", "hqk", "mix", "model", "dir"):
            raise ValueError(f"--filter {item!r}: expected key=value with key hv, hqk, mix, model or dir")
        values = {v.strip() for v in value.split("|") if v.strip()}
        if key == "dir" and not values <= set(ROW_DIRECTIONS):
            raise ValueError(f"--filter {item!r}: dir is one of {', '.join(ROW_DIRECTIONS)}")
        out[key] = out[key] & values if key in out else values
    return out


def parse_config_spec(spec: str) -> tuple[int, int, str | None]:
    """--config "HQK/HV[:MIX]" (e.g. 16/32, 16/32:1x65536) -> (hqk, hv, mix or None)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*(?::\s*(\S+))?\s*", spec)
    if not m:
        raise ValueError(f"--config {spec!r}: expected HQK/HV or HQK/HV:MIX, e.g. 16/32:1x32768")
    hqk, hv, mix = int(m.group(1)), int(m.group(2)), m.group(3)
    if hqk < 1 or hv % hqk:
        raise ValueError(f"--config {spec!r}: Hv must be a positive multiple of Hqk")
    if mix is not None:
        lengths_of(mix)  # raises on a bad mix
    return hqk, hv, mix


def table_configs(table: str, quick: bool) -> list[Config]:
    if table == "fwd":
        heads, mixes = (QUICK_FWD_HEADS, QUICK_FWD_MIXES) if quick else (FWD_HEADS, FWD_MIXES)
    else:
        heads, mixes = (QUICK_BWD_HEADS, QUICK_BWD_MIXES) if quick else (BWD_HEADS, BWD_MIXES)
    return [Config(table, model, hqk, hv, mix) for model, hqk, hv in heads for mix in mixes]


def _matches(cfg: Config, flt: dict[str, set[str]]) -> bool:
    fields = {"hv": str(cfg.h_v), "hqk": str(cfg.h_qk), "mix": cfg.seqlens, "model": cfg.model}
    return all(fields[k] in v for k, v in flt.items() if k != "dir")


def row_directions(table: str, flt: dict[str, set[str]]) -> tuple[str, ...]:
    """The row directions of a table that the filter keeps."""
    return tuple(d for d in TABLE_DIRECTIONS[table] if "dir" not in flt or d in flt["dir"])


def select(direction: str, quick: bool = False, filter_text: str = "", specs: list[str] | None = None) -> list[Config]:
    """The configurations a run measures, in table order.

    direction: "fwd" (forward table), "bwd" (backward table: bwd and fwdbwd rows) or "all".
    specs (--config): keep only configurations with these heads (and mix); a spec naming a mix that
    is not in the table adds a custom configuration (model "custom") to each selected table.
    """
    flt = parse_filter(filter_text)
    tables = ["fwd", "bwd"] if direction == "all" else [direction]
    if direction not in ("fwd", "bwd", "all"):
        raise ValueError(f"--direction {direction!r}: expected fwd, bwd or all")
    parsed = [parse_config_spec(s) for s in specs or []]
    out: list[Config] = []
    for table in tables:
        if not row_directions(table, flt):
            continue
        configs = table_configs(table, quick and not parsed)  # --config looks in the full table
        if parsed:
            keep = []
            for hqk, hv, mix in parsed:
                hits = [c for c in configs if (c.h_qk, c.h_v) == (hqk, hv) and mix in (None, c.seqlens)]
                if not hits and mix is not None:
                    hits = [Config(table, "custom", hqk, hv, mix)]
                keep += [c for c in hits if c not in keep]
            configs = keep
        out += [c for c in configs if _matches(c, flt)]
    return out
