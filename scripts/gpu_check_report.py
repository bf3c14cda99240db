#!/usr/bin/env python3
"""scripts/gpu-check's records and reports (kept out of the bash script).

  gpu_check_report.py record LOGS KIND key=value ...
      appends one JSON line to LOGS/results.jsonl.
  gpu_check_report.py step LOGS OUT NAME STATUS RC ELAPSED_S [LOG]
      records a finished step (outcome, time, the tail of its log; for a
      build log every `error:` line too) and rewrites, under OUT, the live
      files a run cut short still returns: gpu-check-steps.md (read this),
      gpu-check-steps.jsonl and build-errors.txt.
  gpu_check_report.py final LOGS MD JSON ROWS GPU_MEM
      the full report: machine, steps, build errors, CUDA tests, the
      reference scenario against the plans, PyTorch's own FSDP.
"""
import json
import os
import re
import shutil
import sys

TAIL_LINES = 15
ERROR_RE = re.compile(r"\berror:|^CMake Error|\bfatal error\b|undefined reference to")


def read_records(logs):
    path = os.path.join(logs, "results.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def append(logs, rec):
    with open(os.path.join(logs, "results.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def tail_of(logs, name, n=TAIL_LINES):
    try:
        return open(os.path.join(logs, name), errors="replace").read().splitlines()[-n:]
    except OSError:
        return []


def error_lines(logs, name):
    """Every distinct compiler/linker/CMake error line of a log, in order."""
    seen, out = set(), []
    try:
        for line in open(os.path.join(logs, name), errors="replace"):
            line = line.rstrip("\n")
            if ERROR_RE.search(line) and line not in seen:
                seen.add(line)
                out.append(line)
    except OSError:
        pass
    return out


def steps_markdown(recs):
    L = ["| step | outcome | exit | seconds | at second |", "|---|---|---|---|---|"]
    for r in (r for r in recs if r["kind"] == "step"):
        L.append("| %s | %s | %s | %s | %s |" % (r["name"], r["status"], r.get("rc", ""), r.get("elapsed_s", ""),
                                               r.get("ended_at_s", "")))
    return L


def write_live(logs, out):
    recs = read_records(logs)
    machine = next((r for r in recs if r["kind"] == "machine"), {})
    L = ["# gpu-check steps so far (%s)" % machine.get("date", "?"), ""]
    for k in ("card", "driver", "torch", "torch_cuda", "nccl_wheel", "nccl_header", "fmt", "carry", "command"):
        if k in machine:
            L.append("- %s: %s" % (k, machine[k]))
    L.append("")
    L += steps_markdown(recs)
    errors = []
    for r in (r for r in recs if r["kind"] == "step"):
        if r.get("errors"):
            errors += r["errors"]
        L.append("")
        L.append("## %s: %s (exit %s, %s s)" % (r["name"], r["status"], r.get("rc", ""), r.get("elapsed_s", "")))
        if r.get("errors"):
            L.append("%d error lines (all in build-errors.txt); the first 20:" % len(r["errors"]))
            L += ["    " + e for e in r["errors"][:20]]
        if r.get("tail"):
            L.append("log tail (%s):" % r.get("log", ""))
            L += ["    " + t for t in r["tail"]]
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "gpu-check-steps.md"), "w").write("\n".join(L) + "\n")
    shutil.copyfile(os.path.join(logs, "results.jsonl"), os.path.join(out, "gpu-check-steps.jsonl"))
    if errors:
        open(os.path.join(out, "build-errors.txt"), "w").write("\n".join(errors) + "\n")


def cmd_step(logs, out, name, status, rc, elapsed, log=""):
    rec = {"kind": "step", "name": name, "status": status, "rc": rc, "elapsed_s": elapsed,
           "ended_at_s": os.environ.get("GPU_CHECK_NOW_S", ""), "log": log}
    if log:
        rec["tail"] = tail_of(logs, log)
        if name.startswith(("build", "configure", "gtest")):
            rec["errors"] = error_lines(logs, log)
    append(logs, rec)
    write_live(logs, out)


def load_json(logs, name):
    """A JSON file of the logs directory, or None when it is missing or unreadable."""
    try:
        return json.load(open(os.path.join(logs, name)))
    except Exception:
        return None


def log_tail(logs, name, n=15):
    """The last n lines of a log in the logs directory ([] when there is none)."""
    try:
        return open(os.path.join(logs, name), errors="replace").read().splitlines()[-n:]
    except Exception:
        return []


def machine_and_steps_markdown(recs, out, L):
    """The machine table, each step's outcome, the build errors and the configure line."""
    machine = out["machine"]
    L.append("# shardfit gpu-check, %s" % machine.get("date", "?"))
    L.append("")
    L.append("| | |\n|---|---|")
    for k in ("card", "card_memory", "compute_cap", "driver", "torch", "torch_cuda", "libtorch_prefix", "nccl_wheel",
              "nccl_header", "nccl_root", "cuda_root", "nvcc", "fmt", "carry", "torch_cuda_arch_list", "cmake",
              "compiler", "nproc"):
        L.append("| %s | %s |" % (k, machine.get(k, "?")))
    L.append("| command | `%s` |" % machine.get("command", "?"))
    L.append("")
    L.append("## Steps (outcome, seconds)")
    L += steps_markdown(recs)
    L.append("")
    steps = [r for r in recs if r["kind"] == "step"]
    out["steps"] = steps
    errors = [e for r in steps for e in r.get("errors", [])]
    out["build_errors"] = errors
    L.append("## Build errors: %d" % len(errors))
    L += ["    " + e for e in errors[:60]]
    if len(errors) > 60:
        L.append("    ... %d more in build-errors.txt" % (len(errors) - 60))
    for r in steps:
        if r["status"] != "ok" and r.get("tail"):
            L.append("")
            L.append("%s (%s), log tail:" % (r["name"], r["status"]))
            L += ["    " + t for t in r["tail"]]
    gpu_line = next((r.get("gpu_line") for r in recs if r["kind"] == "configure" and r.get("gpu_line")), None)
    if gpu_line:
        L.append("")
        L.append("Configure: " + gpu_line)


def tests_markdown(logs, recs, out, L):
    """The CUDA test binaries: passed, failed and skipped cases, and their recorded properties."""
    L.append("")
    L.append("## CUDA tests")
    for r in (r for r in recs if r["kind"] == "test"):
        r = dict(r)
        j = load_json(logs, r.get("json", "")) if r.get("json") else None
        if j:
            cases = [c for s in j.get("testsuites", []) for c in s.get("testsuite", [])]
            r["passed"] = sum(1 for c in cases if not c.get("failures") and c.get("result") != "SKIPPED")
            r["failed"] = [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]
            r["skipped"] = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
            r["properties"] = {c["name"] + "." + k: v for c in cases for k, v in c.items()
                               if k.startswith(("nccl_", "outside_", "measured_", "predicted_", "alloc_"))}
        out["tests"].append(r)
        if "passed" in r:
            L.append("- %s: %d passed, %d failed, %d skipped %s" % (r["binary"], r["passed"], len(r["failed"]),
                     len(r["skipped"]), r.get("properties") or ""))
            for f in r["failed"]:
                L.append("    - FAILED %s" % f)
        else:
            L.append("- %s: %s" % (r["binary"], "not built" if r.get("rc") == "missing" else "exit %s (see %s)" % (r.get("rc"), r.get("log"))))
    L.append("")


def reference_markdown(logs, recs, out, L, rows_text, gpu_mem):
    """The reference scenario's rows: the plans' max batches, the runs at max and max+1, PyTorch's.

    Returns the PyTorch reference's JSON (None when it did not run)."""
    plans = {}
    for r in (r for r in recs if r["kind"] == "plan"):
        j = load_json(logs, r["json"])
        plans[(r["model"], r["world"], r["variant"])] = {c["id"]: c for c in (j or {}).get("candidates", [])}
        out["plans"].append(dict(r, ok=j is not None))
    fsdp = load_json(logs, "fsdp_reference.json")
    out["fsdp_reference"] = fsdp
    # The reference rows' own (FSDP1/DDP) results; FSDP2 rows of the same
    # candidate are listed in the section below.
    fsdp_rows = {(x.get("model"), str(x.get("world")), x.get("id")): x for x in (fsdp or {}).get("rows", [])
                 if x.get("fsdp", 1) == 1 and str(x.get("row")) in [str(i) for i in range(1, 11)]}
    L.append("## Reference scenario, capped to %s (loopback ranks)" % gpu_mem)
    L.append("")
    L.append("Predicted max batch: `shardfit plan --device titan-rtx-24gb` (Titan), and the same with `--gpu-mem %s` (cap), "
             "which the runs use. Runs: `shardfit run --device cuda --backend loopback --gpu-mem %s --profile titan-rtx-24gb` "
             "at the cap's max and max+1 (the engine's CUDA path; its first run on a card, unless an earlier report here "
             "shows one). "
             "FSDP: PyTorch's own, fake process group (scripts/fsdp_reference.py)." % (gpu_mem, gpu_mem))
    L.append("")
    L.append("| # | model | world | candidate | 2022 Titan max | plan max (Titan) | plan max (cap) | run at max | run at max+1 | PyTorch max | PyTorch tokens/s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = [r for r in recs if r["kind"] == "run"]
    for i, line in enumerate(rows_text.splitlines(), 1):
        model, world, cid, ref = line.split()
        def pmax(variant):
            c = plans.get((model, world, variant), {}).get(cid)
            return "" if c is None else str(c["max_batch_per_gpu"])
        mine = [r for r in runs if r.get("row") == str(i)]
        if not mine and not fsdp_rows.get((model, world, cid)) and not plans.get((model, world, "cap")):
            continue
        cells = []
        for r in mine[:2]:
            rep = load_json(logs, r.get("json", "")) if r.get("verdict") == "ran" else None
            if rep:
                rk = (rep.get("ranks") or [{}])[0]
                m = rk.get("measured", {})
                cell = "b%s: %s, peak reserved %.2f GiB, err %s%%" % (
                    r["batch"], "OOM" if rk.get("oom") else "fits", (m.get("peak_reserved_bytes") or 0) / 2**30,
                    rk.get("peak_error_pct", "?"))
                r["report"] = {"oom": rk.get("oom"), "measured": m, "predicted": rk.get("predicted"),
                               "peak_error_pct": rk.get("peak_error_pct")}
            else:
                cell = "b%s: %s" % (r["batch"], r.get("verdict"))
            cells.append(cell)
            out["runs"].append(r)
        while len(cells) < 2:
            cells.append("")
        f = fsdp_rows.get((model, world, cid)) or {}
        L.append("| %d | %s | %s | `%s` | %s | %s | %s | %s | %s | %s | %s |" % (
            i, model, world, cid, ref or "OOM at 1", pmax("titan"), pmax("cap"), cells[0], cells[1],
            f.get("max_batch", f.get("status", "")), ("%.0f" % f["tokens_per_s"]) if f.get("tokens_per_s") else ""))
    L.append("")
    return fsdp


def pytorch_reference_markdown(logs, recs, fsdp, L):
    """The PyTorch reference's own table (scripts/fsdp_reference.py), or its log's tail when it failed."""
    if fsdp:
        L.append("## PyTorch reference (scripts/fsdp_reference.py)")
        L.append("")
        for k in ("torch", "model_impl", "process_group", "cap_bytes", "outside_allocator_bytes", "outside_allocator_note",
                  "notes"):
            if k in fsdp:
                L.append("- %s: %s" % (k, fsdp[k]))
        L.append("")
        L.append("| # | model | world | candidate | FSDP | seq | attention | cap | max batch | status | peak reserved | peak allocated | tokens/s |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for x in fsdp.get("rows", []):
            gib = lambda k: "%.3f GiB" % (x[k] / 2**30) if x.get(k) else ""
            L.append("| %s | %s | %s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                x.get("row"), x.get("model"), x.get("world"), x.get("id"), x.get("fsdp", 1),
                x.get("seq_len", fsdp.get("seq_len")), x.get("attn", "eager"), x.get("gpu_mem", fsdp.get("gpu_mem")),
                x.get("max_batch", ""), x.get("status", ""), gib("peak_reserved_bytes"), gib("peak_allocated_bytes"),
                ("%.0f" % x["tokens_per_s"]) if x.get("tokens_per_s") else ""))
        L.append("")
        L.append("Every trial (batch, fits, peak bytes, bytes at each phase of each step) is in the JSON beside this file.")
    else:
        fr = next((r for r in recs if r["kind"] == "fsdp"), None)
        if fr:
            L.append("## PyTorch reference: no result (exit %s)" % fr.get("rc"))
            for line in log_tail(logs, fr.get("log", ""), 10):
                L.append("    " + line)


def cmd_final(logs, md_path, js_path, rows_text, gpu_mem):
    recs = read_records(logs)
    machine = next((r for r in recs if r["kind"] == "machine"), {})
    out = {"schema": "shardfit.gpu-check/2", "machine": machine, "tests": [], "plans": [], "runs": [],
           "fsdp_reference": None}
    L = []
    machine_and_steps_markdown(recs, out, L)
    tests_markdown(logs, recs, out, L)
    fsdp = reference_markdown(logs, recs, out, L, rows_text, gpu_mem)
    pytorch_reference_markdown(logs, recs, fsdp, L)
    L.append("")
    L.append("Unmeasured until this report says otherwise; every figure above comes from this run's logs.")
    open(md_path, "w").write("\n".join(L) + "\n")
    json.dump(out, open(js_path, "w"), indent=1)
    print(md_path)
    print(js_path)


def main(argv):
    if len(argv) >= 3 and argv[1] == "record":
        append(argv[2], dict([("kind", argv[3])] + [tuple(p.split("=", 1)) for p in argv[4:]]))
    elif len(argv) >= 8 and argv[1] == "step":
        cmd_step(*argv[2:])
    elif len(argv) == 7 and argv[1] == "final":
        cmd_final(*argv[2:])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
