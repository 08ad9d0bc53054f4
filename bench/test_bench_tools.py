"""CPU tests of the benchmark's torch-free parts (python/flashgdn/bench): the tables and filters, the
command line, the floors, the CSV records, the summary generator, the printed table and (when
matplotlib is importable) the plots. Plain Python, no torch, no GPU; run by ctest (bench_tools) and
directly: python3 bench/test_bench_tools.py
"""

import contextlib
import csv
import importlib
import importlib.util
import io
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from summarize import torch_free_bench  # noqa: E402

torch_free_bench()
from flashgdn.bench import cli, configs, floors, report, results, summary  # noqa: E402

RESULTS = HERE / "results"


class Tables(unittest.TestCase):
    def test_sizes(self):
        self.assertEqual(len(configs.table_configs("fwd", False)), 171)
        self.assertEqual(len(configs.table_configs("bwd", False)), 32)
        self.assertEqual(len(configs.table_configs("fwd", True)), 15)
        self.assertEqual(len(configs.table_configs("bwd", True)), 8)

    def test_tables_match_the_published_csv(self):
        published = results.read_published(results.PUBLISHED_CSV)
        keys = {(c.table, c.seqlens, c.h_qk, c.h_v) for t in ("fwd", "bwd") for c in configs.table_configs(t, False)}
        self.assertEqual(keys, set(published))

    def test_lengths(self):
        cases = {"1x32768": [32768], "8192x4": [8192] * 4, "1024x8": [1024] * 8, "28672+4096": [28672, 4096],
                 "5000": [5000], "8k_1seq": [8192], "32k_4seq": [7212, 7072, 13725, 4759]}
        for mix, lengths in cases.items():
            self.assertEqual(configs.lengths_of(mix), lengths, mix)
        for mix in configs.BWD_MIXES:
            total = int(mix.split("k_")[0]) * 1024
            self.assertEqual(sum(configs.lengths_of(mix)), total, mix)
        for bad in ("", "x", "12+", "0", "3+0", "1x", "32k_0seq", "abc"):
            with self.assertRaises(ValueError, msg=bad):
                configs.lengths_of(bad)

    def test_filters(self):
        self.assertEqual(len(configs.select("fwd", filter_text="hv=32")), 57)  # (8,32), (16,32), (32,32)
        self.assertEqual(len(configs.select("bwd", filter_text="hv=16|8")), 16)
        self.assertEqual(len(configs.select("all", filter_text="mix=1x32768")), 9)
        self.assertEqual(len(configs.select("all", filter_text="dir=fwdbwd")), 32)  # the fwd table drops out
        self.assertEqual(configs.row_directions("bwd", configs.parse_filter("dir=bwd")), ("bwd",))
        self.assertEqual(configs.row_directions("bwd", configs.parse_filter("hv=4")), ("bwd", "fwdbwd"))
        self.assertEqual(len(configs.select("fwd", filter_text="hv=32,mix=1x32768|8192x4")), 6)
        self.assertEqual(len(configs.select("fwd", filter_text="model=Sym h32")), 19)
        self.assertEqual(configs.parse_filter("seqlens=a,h_v=3"), {"mix": {"a"}, "hv": {"3"}})
        for bad in ("hv", "colour=red", "dir=sideways"):
            with self.assertRaises(ValueError, msg=bad):
                configs.parse_filter(bad)

    def test_config_specs(self):
        self.assertEqual(len(configs.select("fwd", specs=["16/32"])), 19)
        self.assertEqual(len(configs.select("fwd", quick=True, specs=["16/64:8192x4"])), 1)  # outside --quick
        custom = configs.select("all", specs=["16/32:1x65536"])
        self.assertEqual([(c.table, c.model, c.seqlens) for c in custom],
                         [("fwd", "custom", "1x65536"), ("bwd", "custom", "1x65536")])
        self.assertEqual(len(configs.select("bwd", specs=["16/32:8k_8seq", "2/4"])), 9)
        for bad in ("16", "16/33", "a/b", "16/32:bad"):
            with self.assertRaises(ValueError, msg=bad):
                configs.parse_config_spec(bad)


class CommandLine(unittest.TestCase):
    def run_main(self, argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(argv)
        return rc, out.getvalue()

    def test_list(self):
        rc, text = self.run_main(["--quick", "--list"])
        self.assertEqual(rc, 0)
        self.assertIn("23 configurations", text)
        rc, text = self.run_main(["--direction", "bwd", "--filter", "hv=32", "--filter", "mix=8k_8seq", "--list"])
        self.assertIn("161+1928+3157+563+1244+229+177+733", text)
        self.assertIn("1 configurations", text)

    def test_defaults_and_errors(self):
        args = cli.parse_args([])
        self.assertEqual((args.direction, args.replays, args.gates, args.anchors), ("all", 30, "bench",
                                                                                    "fla,flashqla,flashinfer"))
        self.assertEqual(len(args.configs), 171 + 32)
        for bad in (["--anchors", "triton"], ["--direction", "up"], ["--filter", "hv=7"], ["--config", "3/4:zz"],
                    ["--replays", "0"]):
            with self.assertRaises(SystemExit, msg=bad), contextlib.redirect_stderr(io.StringIO()):
                cli.parse_args(bad)


class Floors(unittest.TestCase):
    def test_forward(self):
        # one chunk, one head: 2 * (4*C*C*D + 3*C*D*D) = 10.49 MFLOP
        self.assertEqual(floors.forward_flops([64], 1, 1), 2 * (4 * 64 * 64 * 128 + 3 * 64 * 128 * 128))
        self.assertEqual(floors.chunk_count([1, 64, 65, 130]), 1 + 1 + 2 + 3)
        # the formula of the records since 0aab96f
        lengths, hqk, hv, D = [28672, 4096], 2, 8, 128
        chunks = sum((n + 63) // 64 for n in lengths)
        old = chunks * hv * 2 * (2 * 64 * 64 * D + 2 * 64 * D * D + 2 * 64 * 64 * D + D * 64 * D)
        self.assertEqual(floors.forward_flops(lengths, hqk, hv), old)
        old_bytes = 32768 * (2 * hqk * D * 2 + 2 * hv * D * 2 + 2 * hv * 4) + 2 * 2 * hv * D * D * 4
        self.assertEqual(floors.forward_bytes(lengths, hqk, hv), old_bytes)

    def test_directions_add_up(self):
        args = ([7212, 25556], 16, 32, 3e12, 8e14)
        f, b, fb = (floors.floors_ms(d, *args) for d in ("fwd", "bwd", "fwdbwd"))
        self.assertAlmostEqual(fb[0], f[0] + b[0])
        self.assertAlmostEqual(fb[1], f[1] + b[1])
        with self.assertRaises(ValueError):
            floors.floors_ms("sideways", *args)

    def test_matches_the_legacy_records(self):
        """The floors of the 0aab96f record: every row implies the same ceilings with these formulas."""
        path = RESULTS / "2026-11-29_forward_0aab96f.csv"
        if not path.is_file():
            self.skipTest("record not present")
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))

        def args(row):
            return configs.lengths_of(row["seqlens"]), int(row["h_qk"]), int(row["h_v"])
        # the ceilings each row implies are one run's (the record joins two runs: 2.75 and 2.77 TB/s)
        for row in rows:
            bandwidth = floors.forward_bytes(*args(row)) / (float(row["memory_floor_ms"]) * 1e-3)
            rate = floors.forward_flops(*args(row)) / (float(row["tensor_floor_ms"]) * 1e-3)
            self.assertLess(abs(bandwidth / 2.76e12 - 1), 0.01, row)
            self.assertLess(abs(rate / 776e12 - 1), 0.015, row)


def sample_row(**kw):
    row = dict(direction="fwd", model="m", seqlens="1x4096", lengths="4096", h_qk=2, h_v=8, tokens=4096, gates="bench",
               flashgdn_ms=2.0, fla_ms=1.0, flashqla_ms=None, flashinfer_ms=None, fla_pub_ms="0.9",
               flashqla_pub_ms="0.5", flashinfer_pub_ms="0.8", mem_floor_ms=0.1, mma_floor_ms=0.2, rel_err_o=3e-3,
               rel_err_ht=1e-3, fla_err=4e-3, fla_vs_flashgdn=2e-3, notes="", timing="flashgdn=graph;fla=graph",
               copy_tbps=2.7, gemm_tflops=790.0, gpu="NVIDIA H200", commit="abc1234", versions="flashgdn 0.1.0")
    row.update(kw)
    return results.complete_row(row)


class Records(unittest.TestCase):
    def test_best_anchor(self):
        self.assertEqual(results.best_anchor({"fla": 1.0, "flashqla": None}, {"fla": 0.5, "flashqla": 0.7}),
                         ("flashqla", 0.7, "published"))   # FLA's published number cannot beat its live one
        self.assertEqual(results.best_anchor({"fla": 0.6}, {"flashqla": 0.7}), ("fla", 0.6, "live"))
        self.assertEqual(results.best_anchor({"fla": None}, {}), ("", None, ""))

    def test_complete_row(self):
        row = sample_row()
        self.assertEqual((row["best_anchor"], row["anchor_source"]), ("flashqla", "published"))
        self.assertAlmostEqual(row["speedup"], 0.25)
        self.assertAlmostEqual(row["floor_fraction"], 0.1)
        self.assertAlmostEqual(row["flashgdn_err"], 3e-3)
        live = sample_row(flashqla_ms=0.4)
        self.assertEqual((live["best_anchor"], live["anchor_source"], live["speedup"]), ("flashqla", "live", 0.2))
        none = sample_row(flashgdn_ms=None)
        self.assertIsNone(none["speedup"])

    def test_required_columns(self):
        required = ["direction", "model", "seqlens", "h_qk", "h_v", "flashgdn_ms", "flashqla_ms", "flashinfer_ms",
                    "fla_ms", "anchor_source", "mem_floor_ms", "mma_floor_ms", "rel_err_o", "gpu", "commit"]
        self.assertEqual([c for c in required if c not in results.COLUMNS], [])
        self.assertEqual(len(set(results.COLUMNS)), len(results.COLUMNS))

    def test_writer_is_incremental_and_round_trips(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "sub" / results.csv_name("2026-12-01", "all", "abc1234-dirty", True, "part 1")
            self.assertEqual(path.name, "2026-12-01_all_abc1234-dirty_quick_part-1.csv")
            writer = results.CsvWriter(path)
            writer.write(sample_row())
            self.assertEqual(len(results.read_csv(path)), 1)      # readable before close
            writer.write(sample_row(direction="bwd", rel_err_o=None, err_dq=5e-3, fla_err=float("nan")))
            writer.close()
            rows = results.read_csv(path)
            self.assertEqual([r["direction"] for r in rows], ["fwd", "bwd"])
            self.assertEqual(rows[0]["speedup"], "0.250")
            self.assertEqual(rows[0]["rel_err_o"], "3.00e-03")
            self.assertEqual(rows[0]["flashgdn_ms"], "2.0000")
            self.assertEqual(rows[1]["rel_err_o"], "")
            self.assertEqual(rows[1]["flashgdn_err"], "5.00e-03")
            self.assertEqual(rows[1]["fla_err"], "nan")

    def test_legacy_records(self):
        for name, direction, n in (("2026-11-29_forward_0aab96f.csv", "fwd", 171),
                                   ("2026-11-29_backward_7c6b158.csv", "bwd", 30)):
            path = RESULTS / name
            if not path.is_file():
                continue
            rows = [r for r in results.read_csv(path) if r["direction"] == direction]
            self.assertEqual(len(rows), n)
            for r in rows:
                self.assertIsNotNone(results.to_float(r["flashgdn_ms"]))
                self.assertIsNotNone(results.to_float(r["mma_floor_ms"]))
                self.assertIn(r["anchor_source"], ("live", "published"))
                self.assertIsNotNone(r["speedup"])
                self.assertIsNotNone(results.to_float(r["flashgdn_err"]))


class Summary(unittest.TestCase):
    def test_geomean(self):
        self.assertAlmostEqual(summary.geomean([1, 4]), 2.0)
        self.assertIsNone(summary.geomean([None, 0, float("nan")]))

    def test_stats(self):
        rows = [sample_row(), sample_row(seqlens="1x8192", flashgdn_ms=0.5, fla_ms=1.0)]
        s = summary.direction_stats(rows)
        fla = s["speedups"][("fla", "live")]
        self.assertAlmostEqual(fla["geomean"], math.sqrt(0.5 * 2.0))
        self.assertEqual((fla["n"], fla["faster"]), (2, 1))
        self.assertEqual(s["worst"][0]["seqlens"], "1x4096")
        self.assertAlmostEqual(s["errors"]["fla"]["vs_max"], 2e-3)

    def test_latest_and_readme(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            for name, rows in (("2026-12-01_forward_aaa1111.csv", [sample_row(seqlens="old")]),
                               ("2026-12-02_all_bbb2222_quick.csv", [sample_row(seqlens="quick")]),
                               ("2026-12-02_all_ccc3333_part1.csv", [sample_row(seqlens="p1")]),
                               ("2026-12-02_all_ccc3333_part2.csv", [sample_row(seqlens="p2"),
                                                                     sample_row(direction="bwd", seqlens="b")])):
                with results.CsvWriter(tmp / name) as w:
                    for r in rows:
                        w.write(r)
            picked = summary.latest(sorted(tmp.glob("*.csv")))
            self.assertEqual(sorted(r["seqlens"] for r in picked["fwd"][0]), ["p1", "p2"])  # parts merged
            self.assertEqual([r["seqlens"] for r in picked["bwd"][0]], ["b"])
            explicit = summary.latest([tmp / "2026-12-01_forward_aaa1111.csv"], explicit=True)
            self.assertEqual([r["seqlens"] for r in explicit["fwd"][0]], ["old"])

            readme = tmp / "README.md"
            readme.write_text("# title\n\nintro\n\n" + summary.BEGIN + "\nold\n" + summary.END + "\n\nafter\n")
            block = summary.render(picked, tmp)
            summary.write_readme(readme, block)
            first = readme.read_text()
            summary.write_readme(readme, block)
            self.assertEqual(readme.read_text(), first)               # idempotent
            self.assertTrue(first.startswith("# title\n\nintro\n\n"))
            self.assertTrue(first.endswith("\n\nafter\n"))
            self.assertNotIn("\nold\n", first)
            self.assertIn("### Forward (`fwd`): 2 rows", first)
            self.assertIn("| vs best anchor |", first)
            fresh = tmp / "new" / "README.md"
            summary.write_readme(fresh, block)
            self.assertIn(summary.END, fresh.read_text())

    def test_same_day_ties_go_to_the_newest_commit(self):
        """Two full records of one day with the same live anchors: the later commit in git history
        wins, whatever the file times (a clean clone gives every file the checkout time)."""
        if shutil.which("git") is None:
            self.skipTest("git not installed")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            git = lambda *args: subprocess.run(["git", "-C", str(tmp), *args], check=True, capture_output=True,
                                               text=True).stdout.strip()
            git("init", "-q")
            commits = []
            for message in ("first", "second"):
                git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message)
                commits.append(git("rev-parse", "--short=7", "HEAD"))
            paths = []
            for commit in commits:
                path = tmp / f"2026-12-02_forward_{commit}.csv"
                with results.CsvWriter(path) as w:
                    w.write(sample_row(seqlens=commit))
                paths.append(path)
            os.utime(paths[1], (1.0e9, 1.0e9))  # the newer commit's file is the older file
            picked = summary.latest(paths)
            self.assertEqual([r["seqlens"] for r in picked["fwd"][0]], [commits[1]])

    def test_main_on_the_repository_records(self):
        if not (RESULTS / "2026-11-29_forward_5f5b6be.csv").is_file():
            self.skipTest("records not present")
        # A copy of the tree may come without .git, or with an older history (the device machine's):
        # then the records bench/README.md names cannot be put in order among same-day ones.
        order = summary._commit_order([RESULTS])
        named = [summary._file_key(pathlib.Path(name))[1]
                 for name in re.findall(r"Record `bench/results/([^`]+\.csv)`", (HERE / "README.md").read_text())]
        if not named or any(commit not in order for commit in named):
            self.skipTest("the records bench/README.md names are outside the git history here")
        out = io.StringIO()
        cwd = os.getcwd()
        try:
            os.chdir(HERE.parent)
            with contextlib.redirect_stdout(out):
                self.assertEqual(summary.main(["--stdout"]), 0)
        finally:
            os.chdir(cwd)
        text = out.getvalue()
        self.assertIn("### Forward (`fwd`): 171 rows", text)  # the latest full table alone
        self.assertIn("### Backward only (`bwd`)", text)

        def records(block):  # the record line of each direction
            return [line for line in block.splitlines() if line.startswith("Record `")]
        readme = (HERE / "README.md").read_text()
        self.assertEqual(records(text), records(readme), "bench/README.md is not generated from the latest records")


class NcuSourceTop(unittest.TestCase):
    @staticmethod
    def report(page: str, top: int) -> str:
        """ncu_source_top's output for a source page's text."""
        import ncu_source_top
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "source.csv"
            path.write_text(page)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert ncu_source_top.main([str(path), "--top", str(top)]) == 0
        return out.getvalue()

    def test_top_lines_and_opcodes(self):
        text = self.report('==PROF== a preamble line\n'
                           '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
                           '"0x10","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1+0x8], R2 ;","600","590"\n'
                           '"0x20","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;","300","10"\n'
                           '"0x30","BAR.SYNC.DEFER_BLOCKING 0x0 ;","1,00","0"\n', top=2)
        self.assertIn("3 SASS lines, 1000 warp-state samples", text)
        self.assertIn(" 60.0%      0x10  SYNCS.PHASECHK", text)
        self.assertNotIn("BAR.SYNC.DEFER_BLOCKING 0x0", text.split("per opcode:")[0])  # not in the top 2
        self.assertIn(" 10.0%  BAR.SYNC.DEFER_BLOCKING", text)
        self.assertNotIn("instructions executed", text)  # no such column on this page

    def test_predicates_and_instruction_mix(self):
        text = self.report('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
                           '"0x10","@!P0 BRA 0x40 ;","500","100"\n'
                           '"0x20","@P1 BRA 0x10 ;","100","300"\n'
                           '"0x30","FFMA R1, R2, R3, R1 ;","400","600"\n', top=4)
        self.assertIn(" 60.0%  BRA", text.split("per opcode:")[1])  # both predicated branches, 600 of 1000
        self.assertIn("instructions executed (warp level): 1000", text)
        executed = text.split("per opcode, executed:")[1]
        self.assertIn(" 60.0%           600  FFMA", executed)
        self.assertIn(" 40.0%           400  BRA", executed)
        self.assertIn(" 60.0%      0x30  FFMA", text.split("lines executed most:")[1])


class NcuRegionsAndContext(unittest.TestCase):
    PAGE = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier",'
            '"stall_long_sb","stall_barrier (Not Issued)"\n'
            '"0x10","LDG.E R2, desc[UR4][R4.64] ;","10","100","0","0","0"\n'
            '"0x20","BAR.SYNC.DEFER_BLOCKING 0x0 ;","0","100","0","0","0"\n'
            '"0x30","@!P0 BRA 0x60 ;","600","100","590","10","590"\n'
            '"0x40","HMMA.16816.F32 R8, R12, R16, R8 ;","40","500","0","0","0"\n'
            '"0x50","BAR.SYNC.DEFER_BLOCKING 0x0 ;","0","100","0","0","0"\n'
            '"0x60","FFMA R1, R2, R3, R1 ;","350","100","300","50","300"\n'
            '"0x70","EXIT ;","0","0","0","0","0"\n')

    def run_tool(self, *extra: str) -> str:
        import gzip
        import ncu_source_top
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "source.csv.gz"  # as h200_check keeps it
            path.write_bytes(gzip.compress(self.PAGE.encode()))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert ncu_source_top.main([str(path), "--top", "3", *extra]) == 0
        return out.getvalue()

    def test_regions_cut_after_barriers(self):
        text = self.run_tool("--regions").split("regions (")[1]
        rows = [line.split() for line in text.splitlines()[1:]]
        self.assertEqual([(r[0], r[2]) for r in rows], [("0x10", "0x20"), ("0x30", "0x50"), ("0x60", "0x70")])
        self.assertEqual(rows[0][3:7], ["2", "lines", "20.0%", "1.0%"])  # 200 of 1000 executed, 10 of 1000 samples
        self.assertEqual(rows[1][5:7], ["70.0%", "64.0%"])
        self.assertIn("ends EXIT", text)

    def test_context_names_the_wait(self):
        text = self.run_tool("--context", "30", "0x99").split("== ", 1)[1]
        self.assertTrue(text.startswith("0x30: barrier 590, long_sb 10\n"))  # not the Not-Issued column
        block = text.split("== ")[0].splitlines()
        self.assertEqual(len(block), 1 + 2 + 1 + 4)  # reasons, 2 lines before, the line, 4 after (the page ends)
        self.assertIn("BAR.SYNC", block[2])
        self.assertIn("0x99: no such line", text)


class AbCompare(unittest.TestCase):
    LOG = ("8x1024:16:32:bwd: whole call {w} us (graph, PDL on), kernels 700.0 us (PDL off), rest 1.0 us\n"
           "       {g} us  backward_grads_kernel (x1)\n"
           "        60.0 us  chunk_inverse_kernel (x1)\n"
           "1x8192:2:4:bwd: whole call 275.0 us (graph, PDL on), kernels 265.0 us (PDL off), rest 10.0 us\n"
           "        75.0 us  backward_ds_pass_kernel (x2)\n")

    def test_rounds_and_changes(self):
        import ab_compare
        base = ab_compare.parse(self.LOG.format(w=700.0, g=400.0) + self.LOG.format(w=710.0, g=410.0))
        self.assertEqual(len(base), 2)  # a row seen again starts the next round
        self.assertEqual(base[1]["8x1024:16:32:bwd"], {"whole call": 710.0, "backward_grads_kernel": 410.0,
                                                        "chunk_inverse_kernel": 60.0})
        cand = ab_compare.parse(self.LOG.format(w=639.0, g=369.0).replace("        60.0 us  chunk_inverse_kernel (x1)\n", ""))
        text = ab_compare.compare([("baseline", base), ("candidate", cand)])  # the baseline's last round
        blocks = {block.splitlines()[0]: block for block in text.split("\n\n") if block.strip()}
        self.assertEqual(list(blocks), ["8x1024:16:32:bwd", "1x8192:2:4:bwd"])
        lines = {line.split()[0]: line for line in blocks["8x1024:16:32:bwd"].splitlines()[2:]}
        self.assertIn("-10.0%", lines["whole"])  # 639 against 710
        self.assertIn("-10.0%", lines["backward_grads_kernel"])  # 369 against 410
        self.assertTrue(lines["chunk_inverse_kernel"].rstrip().endswith("-"))  # absent in the candidate
        self.assertIn("+0.0%", blocks["1x8192:2:4:bwd"].splitlines()[-1])  # backward_ds_pass_kernel
        self.assertIn("candidate whole call by round: -8.7%", blocks["8x1024:16:32:bwd"])  # round 2 absent
        self.assertIn("candidate whole call by round: +0.0%", blocks["1x8192:2:4:bwd"])
        # the fastest rounds: 639 against 700, 369 against 400; the inverse absent in the candidate
        self.assertIn("candidate fastest round against the baseline's: whole call -8.7%, backward_grads -7.8%, "
                      "chunk_inverse -", blocks["8x1024:16:32:bwd"])
        first = ab_compare.compare([("baseline", base), ("candidate", cand)], round_index=0)
        self.assertIn("-8.7%", first)  # 639 against round 1's 700
        with self.assertRaises(ValueError):
            ab_compare.compare([("baseline", base), ("empty", ab_compare.parse("no rows"))])


class TableCompare(unittest.TestCase):
    def write(self, folder, name, times):
        path = pathlib.Path(folder) / name
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["direction", "model", "seqlens", "lengths", "h_qk", "h_v", "flashgdn_ms"])
            for (direction, lengths), t in times.items():
                w.writerow([direction, "m", "s", lengths, 16, 32, t])
        return path

    def test_ratios_and_counts(self):
        import table_compare
        with tempfile.TemporaryDirectory() as d:
            base = self.write(d, "base.csv", {("fwd", "8192"): 1.0, ("fwd", "4096"): 0.5, ("bwd", "8192"): 2.0,
                                              ("bwd", "2048"): 1.0})
            new = self.write(d, "new.csv", {("fwd", "8192"): 0.9, ("fwd", "4096"): 0.5, ("bwd", "8192"): 2.2})
            text = table_compare.compare(table_compare.load(base), table_compare.load(new), rows=True)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(table_compare.main([str(base), str(new)]), 0)
        lines = text.splitlines()
        self.assertTrue(lines[0].startswith("fwd: 2 rows, new / base time geomean 0.949x, 1 faster and 0 slower"))
        self.assertIn("m s 8192 16 32: 0.900", lines[1])  # past the 2% threshold, listed
        self.assertTrue(lines[2].startswith("bwd: 1 rows, new / base time geomean 1.100x, 0 faster and 1 slower"))
        self.assertIn("new.csv against base.csv", out.getvalue())


class Printing(unittest.TestCase):
    def test_row_and_header(self):
        text = report.table_row(sample_row())
        self.assertIn("0.500p", text)          # FlashQLA published
        self.assertIn("0.25x", text)
        self.assertIn("FlashQLA(p)", text)
        self.assertIn("10.0%", text)
        self.assertIn("FLA 4.0e-03 (2.0e-03)", text)
        self.assertEqual(len(report.table_header().splitlines()), 3)
        self.assertIn("-", report.table_row({"direction": "bwd"}))
        self.assertIn("fwd: 1 rows", report.closing_summary([sample_row()]))

    def test_progress(self):
        stream = io.StringIO()
        p = report.Progress(4, stream=stream, width=8)
        p.step("a")
        p.step("b")
        self.assertIn("[####....] 2/4 b", stream.getvalue().splitlines()[-1])
        self.assertIn("left", stream.getvalue().splitlines()[-1])


class AnchorWheels(unittest.TestCase):
    """scripts/anchor_wheels.py: packing into groups under a size limit, split wheels re-joined."""

    def setUp(self):
        spec = importlib.util.spec_from_file_location("anchor_wheels", HERE.parent / "scripts" / "anchor_wheels.py")
        self.aw = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.aw)

    def test_pack_and_collect(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            src.mkdir()
            sizes = {"a-1.0-py3-none-any.whl": 10_000, "b-1.0-py3-none-any.whl": 25_000, "c-1.0-py3-none-any.whl": 5_000}
            for name, size in sizes.items():
                (src / name).write_bytes(os.urandom(size))
            wheels = [("01-x", "s1", src / "a-1.0-py3-none-any.whl"), ("02-y", "s2", src / "b-1.0-py3-none-any.whl"),
                      ("02-y", "s2", src / "c-1.0-py3-none-any.whl")]
            dest = tmp / ".whl"
            dest.mkdir()
            (dest / "a-1.0-py3-none-any.whl").write_bytes(b"old loose copy")
            folders = self.aw.pack(wheels, dest, limit=20_000, part=8_000)
            self.assertEqual(sorted(folders), ["01-x", "02-y-a", "02-y-b"])
            self.assertFalse((dest / "a-1.0-py3-none-any.whl").exists())   # loose copy of a pinned wheel removed
            for folder, files in folders.items():
                self.assertLessEqual(sum(size for _, size in files), 20_000, folder)
                self.assertTrue((dest / folder / "MANIFEST.tsv").is_file())
            manifest = self.aw.read_manifest(dest)
            self.assertEqual([m["wheel"] for m in manifest], list(sizes))
            store = tmp / "store"
            # stage the groups one at a time, as consecutive device calls do
            staged = tmp / "staged"
            ready = {}
            for folder in sorted(folders):
                shutil.copytree(dest / folder, staged / folder)
                ready = self.aw.collect(staged, store, manifest)
                shutil.rmtree(staged / folder)            # a refreshed checkout: pieces kept in the store
            self.assertEqual(sorted(ready), sorted(sizes))
            for name in sizes:
                self.assertEqual((store / name).read_bytes(), (src / name).read_bytes())


class Plots(unittest.TestCase):
    def test_plots(self):
        from flashgdn.bench import plots
        rows = [sample_row(), sample_row(direction="bwd", seqlens="8k_1seq")]
        with tempfile.TemporaryDirectory() as tmp:
            paths, reason = plots.write_plots(rows, pathlib.Path(tmp) / "rec")
            try:
                importlib.import_module("matplotlib")
            except ImportError:
                self.assertEqual(paths, [])
                self.assertIn("matplotlib", reason)
                return
            self.assertEqual([p.name for p in paths], ["rec_speedup.png", "rec_floor.png"])
            for p in paths:
                self.assertEqual(p.read_bytes()[:4], b"\x89PNG")


if __name__ == "__main__":
    unittest.main(verbosity=1)
