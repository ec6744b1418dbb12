#!/usr/bin/python3
"""scale.py - the control plane at 32 to 128 ranks and more: start-up, memory,
file descriptors, faults and exact resume, one table per rank count.

  bench/scale.py [--bin PATH] [--ranks 32,64,128] [--model mnist-net]
                 [--batch-size 4] [--steps 6] [--faults kill,stop,term,slow]
                 [--full-mesh N] [--bound 5] [--settle S] [--check] [--json FILE] [--keep DIR]
                 [--launcher CMD] [--mpirun-args ARGS] [--train-args ARGS]

Every launch is `mpirun --oversubscribe -np N BIN train --synthetic-data
--model M --batch-size B --threads 1 --no-progress ...` (one thread per rank,
so that a hundred ranks fit on a few cores; compute only, no data loading).
For each rank count:

  start    an uninterrupted run of --steps updates with a checkpoint. Its
           --json summary gives the start-up breakdown (the slowest rank's
           time for each part: process start, MPI init, rank table, lifeline
           mesh, ... first step), peak RSS per rank and over all ranks, open
           files, threads and lifeline connections per rank. "launch" is the
           time from this script starting mpirun to the last rank's first
           update; "exit" to mpirun's exit.
  kill     SIGKILL one rank mid-run (mpirun --enable-recovery: the survivors'
           watchdog ends the job, not mpirun): time from the signal to
           mpirun's exit, and how many ranks name the killed rank.
  stop     SIGSTOP one rank: its partners hear no heartbeat for --peer-timeout
           (3 s) and end the job; the same two figures (mpirun with
           odls_base_sigkill_timeout 0: its clean-up of a stopped rank would
           otherwise add two seconds of its own, SIGCONT, SIGTERM, SIGKILL).
  term     (first) SIGTERM to every rank, as Slurm's preemption sends it:
           every rank stops at one update S and checkpoints; the time to exit,
           the step, and whether `--resume` to S + --steps ends with the param
           digest of the uninterrupted run of S + --steps updates ("start").
  slow     one rank's backward made 300 ms slower in every update
           (RINGTRAIN_TEST_SLOW_RANK): whether the profile's verdict names it.

The victim is rank 3N/4+1: above 64 ranks it is not a heartbeat partner of
rank 0, so its death reaches rank 0 only through the ranks passing the word
on. --full-mesh N lowers the all-to-all mesh's limit (RINGTRAIN_TEST_FULL_MESH)
to see that sparse graph at a few dozen ranks. With --check the script exits 1
when a fault is not ended within --bound seconds, a message names the wrong
rank (or, in the sparse graph, no rank beyond the victim's partners names it),
the preempted ranks disagree on the step, or the resume is not exact.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

VICTIM_SLOW_MS = 300


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def hb_partners(rank, world, full):
    """rt_comm_hb_partners (comm/comm.c): the victim's partners, to tell the forwarded word from the direct."""
    if world <= full:
        return set(range(world)) - {rank}
    out, d = set(), 1
    while d < world:
        out.add((rank + d) % world)
        out.add((rank - d) % world)
        d *= 2
    out.discard(rank)
    return out


class Bench:
    def __init__(self, a):
        self.a = a
        self.tag = "%d.%d" % (os.getpid(), int(time.time()))
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1", RT_SCALE_TAG=self.tag)
        if a.full_mesh:
            self.env["RINGTRAIN_TEST_FULL_MESH"] = str(a.full_mesh)
        self.failures = []

    def train_args(self, steps):
        a = self.a
        return [a.bin, "train", "--synthetic-data", "--model", a.model, "--batch-size", str(a.batch_size),
                "--threads", "1", "--no-progress", "--steps", str(steps)] + a.train_args.split()

    def launch(self, n, args, out, mpirun_args=(), env=None):
        cmd = self.a.launcher.split() + ["--oversubscribe", "-np", str(n)] + self.a.mpirun_args.split() + \
            list(mpirun_args)
        for k in ("RINGTRAIN_TEST_FULL_MESH", "RINGTRAIN_TEST_SLOW_RANK", "RT_SCALE_TAG"):
            if k in (env or self.env):
                cmd += ["-x", k]
        f_out = open(out + ".out", "w")
        f_err = open(out + ".err", "w")
        t0 = time.time()
        p = subprocess.Popen(cmd + args, stdout=f_out, stderr=f_err, env=env or self.env)
        p.files = (f_out, f_err)
        p.t0 = t0
        return p

    @staticmethod
    def finish(p, timeout=900):
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        for f in p.files:
            f.close()
        return rc, time.time()

    def rank_pids(self, p, n, timeout=300):
        """The ranks' pids by OMPI_COMM_WORLD_RANK: this script's processes (RT_SCALE_TAG, passed on by
        mpirun -x), wherever the launcher started them (mpirun's children, or a remote orted's)."""
        tag = ("RT_SCALE_TAG=" + self.tag).encode()
        deadline = time.time() + timeout
        while time.time() < deadline:
            pids = {}
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open("/proc/%s/environ" % d, "rb") as f:
                        env = f.read().split(b"\0")
                    with open("/proc/%s/comm" % d) as f:
                        if f.read().strip() != "ringtrain":
                            continue
                except (OSError, ValueError):
                    continue
                if tag not in env:
                    continue
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        pids[int(e.split(b"=")[1])] = int(d)
            if len(pids) == n:
                return pids
            if p.poll() is not None:
                return None
            time.sleep(0.2)
        return None

    @staticmethod
    def wait_for(path, pattern, p, timeout=600):
        deadline = time.time() + timeout
        rx = re.compile(pattern, re.M)
        while time.time() < deadline:
            try:
                with open(path) as f:
                    if rx.search(f.read()):
                        return True
            except OSError:
                pass
            if p.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def running(self, p, out, n):
        """Waits until the run trains: the banner printed, then the first update (the step line of the
        heartbeat is not visible from here: wait for rank 0's banner, then a margin that grows with n)."""
        if not self.wait_for(out + ".out", r"^  ranks ", p):
            return None
        pids = self.rank_pids(p, n)
        time.sleep(self.a.settle if self.a.settle >= 0 else 3 + n / 32)
        return pids

    @staticmethod
    def summary(path):
        try:
            with open(path) as f:
                lines = [l for l in f if l.startswith("{")]
            return json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            return None

    @staticmethod
    def digest(path):
        try:
            with open(path) as f:
                m = re.findall(r"^\[0/\d+\] param digest: ([0-9a-f]{16})", f.read(), re.M)
            return m[-1] if m else None
        except OSError:
            return None

    def fail(self, what):
        self.failures.append(what)

    # ---- the measurements ---------------------------------------------------------------------------

    def start(self, n, d, steps):
        out = os.path.join(d, "start")
        p = self.launch(n, self.train_args(steps) + ["--json", "--checkpoint-dir", out + ".ck"], out)
        rc, t_end = self.finish(p)
        s = self.summary(out + ".out")
        r = {"rc": rc, "exit_s": t_end - p.t0, "digest": self.digest(out + ".err"), "steps": steps}
        if rc != 0 or not s or "startup" not in s:
            self.fail("%d ranks: the uninterrupted run failed (exit %d), see %s.err" % (n, rc, out))
            return r
        su = s["startup"]
        r.update(launch_s=su["first_step_unix"] - p.t0, spawn_s=su["exec_unix"] - p.t0,
                 to_first_step_s=su["to_first_step_s"],
                 parts=su["parts_s"], per_rank=s["per_rank"])
        return r

    def fault(self, n, d, kind):
        """kill or stop: the time from the signal to mpirun's exit, and the ranks whose message names it."""
        out = os.path.join(d, kind)
        v = n * 3 // 4 + 1 if n > 4 else n - 1
        # kill: --enable-recovery, so that the survivors' watchdog ends the job, not mpirun noticing the death.
        # stop: mpirun's own clean-up of a stopped rank sends SIGCONT, SIGTERM and SIGKILL a second apart
        # (odls_base_sigkill_timeout): without the wait, the job's end is the watchdog's alone.
        mo = ["--enable-recovery"] if kind == "kill" else ["--mca", "odls_base_sigkill_timeout", "0"]
        p = self.launch(n, self.train_args(1000000), out, mo)
        pids = self.running(p, out, n)
        if not pids:
            self.finish(p, 60)
            self.fail("%d ranks, %s: the run did not start (see %s.err)" % (n, kind, out))
            return {}
        t_sig = time.time()
        os.kill(pids[v], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        rc, t_end = self.finish(p, 120)
        if kind == "stop":
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pids[v], sig)
                except OSError:
                    pass
        with open(out + ".err", errors="replace") as f:
            err = f.read()
        # (A rank whose own comm thread was starved of CPU for a while says the victim "ended" while it was not
        # running: it still names the victim, and blames no one else.)
        what = r"(died|ended \(last heard)" if kind == "kill" else r"(has sent no heartbeat|ended \(last heard)"
        # Ranks that name the victim: its partners, which saw it themselves ("rank V (...) died" / "has sent no
        # heartbeat"), and the others, which got the word ("rank D ... ended the job ...: rank V (...) died").
        named = set()
        wrong = set()
        for m in re.finditer(r"^\[(\d+)/\d+\] error: (.*)$", err, re.M):
            r, msg = int(m.group(1)), m.group(2)
            if r != v and re.search(r"rank %d \([^)]*pid %d\) %s" % (v, pids[v], what), msg):
                named.add(r)
            elif re.search(r"rank \d+ \([^)]*\) (died|has sent no heartbeat|ended \(last heard)", msg) and r != v:
                wrong.add(r)
        partners = hb_partners(v, n, self.a.full_mesh or 64)
        beyond = named - partners - {v}
        res = {"victim": v, "secs": t_end - t_sig, "rc": rc, "named": len(named), "beyond_partners": len(beyond),
               "blame_other": len(wrong), "partners": len(partners)}
        if res["secs"] > self.a.bound:
            self.fail("%d ranks, SIG%s of rank %d: the job ended %.1f s later (bound %g s)" %
                      (n, kind.upper(), v, res["secs"], self.a.bound))
        if not named or wrong:
            self.fail("%d ranks, SIG%s of rank %d: %d ranks name it, %d name another rank (see %s.err)" %
                      (n, kind.upper(), v, len(named), len(wrong), out))
        if len(partners) < n - 1 and not beyond:
            self.fail("%d ranks, SIG%s of rank %d: no rank beyond its %d partners names it: the word was not "
                      "passed on" % (n, kind.upper(), v, len(partners)))
        return res

    def term(self, n, d):
        """SIGTERM to every rank; then the uninterrupted reference (the start-up figures' run) is made as
        long as the stopped run plus --steps, and the stopped run resumes to the same length."""
        out = os.path.join(d, "term")
        ck = out + ".ck"
        p = self.launch(n, self.train_args(1000000) + ["--checkpoint-dir", ck], out)
        pids = self.running(p, out, n)
        if not pids:
            self.finish(p, 60)
            self.fail("%d ranks, SIGTERM: the run did not start (see %s.err)" % (n, out))
            return {}
        t_sig = time.time()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        rc, t_end = self.finish(p, 300)
        with open(out + ".err", errors="replace") as f:
            err = f.read()
        steps = set(int(x) for x in re.findall(r"stopped by signal 15 \(SIGTERM\): checkpoint saved at epoch \d+ "
                                                r"step (\d+)", err))
        try:
            with open(os.path.join(ck, "state.json")) as f:
                saved = json.load(f)["optimizer_steps"]
        except (OSError, ValueError, KeyError):
            saved = None
        res = {"secs": t_end - t_sig, "rc": rc, "step": saved, "ckpt": ck}
        if rc != 0 or saved is None or len(steps) > 1:
            self.fail("%d ranks, SIGTERM: exit %d, checkpoint step %s, reported steps %s (see %s.err)" %
                      (n, rc, saved, sorted(steps), out))
            return res
        if res["secs"] > self.a.bound:
            self.fail("%d ranks, SIGTERM: the job ended %.1f s later (bound %g s)" % (n, res["secs"], self.a.bound))
        return res

    def resume(self, n, d, t, ref):
        """Resumes the SIGTERM run to the reference's length: the same digest, bit for bit."""
        out = os.path.join(d, "resume")
        p = self.launch(n, self.train_args(ref["steps"]) + ["--checkpoint-dir", t["ckpt"], "--resume"], out)
        rc, _ = self.finish(p)
        dg = self.digest(out + ".err")
        t["resume_digest"] = dg
        t["resume_exact"] = rc == 0 and dg is not None and dg == ref.get("digest")
        if not t["resume_exact"]:
            self.fail("%d ranks: resumed from step %s to %d: digest %s, uninterrupted %s (exit %d)" %
                      (n, t["step"], ref["steps"], dg, ref.get("digest"), rc))

    def slow(self, n, d):
        out = os.path.join(d, "slow")
        v = n * 3 // 4 + 1 if n > 4 else n - 1
        env = dict(self.env, RINGTRAIN_TEST_SLOW_RANK="%d:%d" % (v, VICTIM_SLOW_MS))
        p = self.launch(n, self.train_args(self.a.steps + 4), out, env=env)
        rc, _ = self.finish(p)
        with open(out + ".out", errors="replace") as f:
            m = re.search(r"^verdict: (.*)$", f.read(), re.M)
        verdict = m.group(1) if m else ""
        named = bool(re.search(r"take [0-9.]+ ms on rank %d and" % v, verdict))
        if not named:
            self.fail("%d ranks: rank %d slowed by %d ms per update, verdict: %s" % (n, v, VICTIM_SLOW_MS, verdict))
        return {"victim": v, "named": named, "verdict": verdict}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                 "ringtrain"))
    ap.add_argument("--ranks", default="32,64,128")
    ap.add_argument("--model", default="mnist-net")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--faults", default="kill,stop,term,slow")
    ap.add_argument("--full-mesh", type=int, default=0)
    ap.add_argument("--settle", type=float, default=-1,
                    help="seconds from the banner to a fault (default 3 + ranks/32: past the first update)")
    ap.add_argument("--bound", type=float, default=5.0)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--launcher", default="mpirun",
                    help="the mpirun command (a wrapper that starts mpirun across nodes: bench/scale_two_nodes.sh)")
    ap.add_argument("--mpirun-args", default="", help="more mpirun options, e.g. '--npernode 16'")
    ap.add_argument("--train-args", default="", help="more train options, e.g. '--peer-timeout 10'")
    ap.add_argument("--json")
    ap.add_argument("--keep")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    faults = [x for x in a.faults.split(",") if x]
    b = Bench(a)
    print("scale: %s, %d CPUs, Linux %s; model %s, batch %d per rank, 1 thread per rank%s" %
          (cpu_model(), os.cpu_count(), os.uname().release, a.model, a.batch_size,
           ", all-to-all heartbeats only up to %d ranks" % a.full_mesh if a.full_mesh else ""), flush=True)
    results = {}
    top = a.keep or tempfile.mkdtemp(prefix="rt-scale-")
    for n in ranks:
        d = os.path.join(top, "np%d" % n)
        os.makedirs(d, exist_ok=True)
        r = {}
        if "term" in faults:
            r["term"] = b.term(n, d)
        steps = a.steps + (r["term"].get("step") or 0 if "term" in r else 0)
        r["start"] = b.start(n, d, steps)
        if r.get("term", {}).get("ckpt") and r["term"].get("step") is not None:
            b.resume(n, d, r["term"], r["start"])
        for k in faults:
            if k in ("kill", "stop"):
                r[k] = b.fault(n, d, k)
            elif k == "slow":
                r[k] = b.slow(n, d)
        results[n] = r
        report_one(n, r)
    print()
    report(results, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_model(), "results": results, "failures": b.failures}, f, indent=1)
    for f in b.failures:
        print("FAIL " + f)
    if not a.keep:
        subprocess.call(["rm", "-rf", top])
    return 1 if a.check and b.failures else 0


def report_one(n, r):
    s = r["start"]
    if "parts" in s:
        print("%d ranks: launch to the first update %.1f s; %s" %
              (n, s["launch_s"], ", ".join("%s %.2f" % (k, v) for k, v in s["parts"].items())), flush=True)


def report(results, a):
    print("start-up, s: launch to the last rank's first update; mpirun to the first rank's exec; then each part,")
    print("from the last rank through the one before to the last rank through it; and what each rank holds:")
    print("%6s %7s %7s %6s %6s %6s %6s %6s %6s %6s %6s %9s %9s %5s %5s" %
          ("ranks", "launch", "mpirun", "proc", "MPI", "table", "mesh", "model", "sync", "step1", "other",
           "RSS/rank", "RSS all", "fds", "links"))
    for n, r in results.items():
        s = r["start"]
        if "parts" not in s:
            print("%6d  (failed)" % n)
            continue
        p, pr = s["parts"], s["per_rank"]
        shown = ("process", "mpi_init", "rank_table", "mesh", "model", "sync", "first_step")
        other = sum(v for k, v in p.items() if k not in shown)
        print("%6d %7.1f %7.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %7.0fMB %7.0fMB %5d %5d" %
              (n, s["launch_s"], s["spawn_s"], p["process"], p["mpi_init"], p["rank_table"], p["mesh"], p["model"],
               p["sync"], p["first_step"], other, pr["rss_max_mb"], pr["rss_total_mb"], pr["fds_max"],
               pr["lifeline_peers_max"]))
    print("\nfaults (seconds from the signal to the job's end; goal %g s):" % a.bound)
    print("%6s %7s %16s %7s %16s %8s %6s %8s %s" %
          ("ranks", "SIGKILL", "ranks naming it", "SIGSTOP", "ranks naming it", "SIGTERM", "step", "resume",
           "slow rank named"))
    for n, r in results.items():
        def f(k):
            x = r.get(k) or {}
            if "secs" not in x:
                return "%7s %16s" % ("-", "-")
            return "%7.1f %16s" % (x["secs"], "%d (%d beyond)" % (x["named"], x["beyond_partners"]))
        t = r.get("term") or {}
        sl = r.get("slow") or {}
        res = {True: "exact", False: "DIFFERS", None: "-"}[t.get("resume_exact")] if t else "-"
        print("%6d %s %s %8s %6s %8s %s" %
              (n, f("kill"), f("stop"), "%.1f" % t["secs"] if "secs" in t else "-", t.get("step", "-"), res,
               ("rank %d: yes" % sl["victim"] if sl.get("named") else "NO") if sl else "-"))


if __name__ == "__main__":
    sys.exit(main())
