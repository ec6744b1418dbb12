#!/usr/bin/python3
"""test_scaling_model.py - the arithmetic of bench/scaling_model.py against
hand computations: the ring and tree all-reduce formulas, the hierarchical
one across nodes, the FIFO overlap simulation on a toy bucket plan, the bucket
plan's cuts (comm/bucket.c's rules), the models' parameter counts against
torchvision's and the paper's, the interpolation of a measured all-reduce
curve, and a predicted table whose 1-GPU row is 100 % efficient.

No timing, no ringtrain binary, no MPI. Exit 0 when every check passes, 1 when
one fails, 77 (skip) without numpy.
"""
import importlib.util
import io
import json
import math
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

if importlib.util.find_spec("numpy") is None:  # scaling_model needs it
    print("skipped: numpy is not installed (apt-get install python3-numpy)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("scaling_model",
                                              os.path.join(HERE, "..", "bench", "scaling_model.py"))
sm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm)


class Formulas(unittest.TestCase):
    def test_ring_by_hand(self):
        # 4 ranks, 100 MB, busbw 100 GB/s, 10 us a step: 2*3/4 * 1e8/1e11 = 1.5 ms, + 2*3*10 us = 60 us.
        self.assertAlmostEqual(sm.t_ring(4, 100e6, 100e9, 10e-6), 1.56e-3, places=12)
        self.assertAlmostEqual(sm.t_ring(4, 100e6, 100e9, 10e-6, o=5e-6), 1.565e-3, places=12)
        self.assertEqual(sm.t_ring(1, 100e6, 100e9, 10e-6), 0.0)

    def test_tree_by_hand(self):
        # 8 ranks, 1 MB, 10 GB/s, 1 us: 2 * 1e6/1e10 = 200 us, + 2 * log2(8) * 1 us = 6 us.
        self.assertAlmostEqual(sm.t_tree(8, 1e6, 10e9, 1e-6), 206e-6, places=12)
        # Not a power of two: ceil(log2 5) = 3 levels.
        self.assertAlmostEqual(sm.t_tree(5, 0, 10e9, 1e-6), 6e-6, places=12)

    def fabric(self):
        return sm.Fabric({"gpus_per_node": 8, "nvl_busbw": 400e9, "nvl_alpha": 1e-6, "ib_busbw": 40e9,
                          "ib_alpha": 5e-6, "call_s": 2e-6, "mpi_alpha": 1e-6, "host_s": 10e-6})

    def test_fabric_in_a_node_is_a_ring(self):
        t, algo = self.fabric().allreduce(8, 80e6)
        # 2 + 2*7/8*80e6/400e9 (350 us) + 14 * 1 us
        self.assertEqual(algo, "ring")
        self.assertAlmostEqual(t, 2e-6 + 350e-6 + 14e-6, places=12)

    def test_fabric_two_nodes_by_hand(self):
        f = self.fabric()
        # 80 MB over 2 nodes: bandwidth-bound; the flat ring (619.75 + 2 us) just beats the hierarchy (626 us).
        t, algo = f.allreduce(16, 80e6)
        intra = 2 * (7 / 8 * 80e6 / 400e9 + 7 * 1e-6)                           # 364 us
        ring2 = 2 * 1 / 2 * 10e6 / 40e9 + 2 * 1 * 5e-6                            # 260 us: B/g = 10 MB, 2 nodes
        tree2 = 2 * 10e6 / 40e9 + 2 * 1 * 5e-6                                    # 510 us
        flat = 2e-6 + 2 * 15 / 16 * 80e6 / min(400e9, 8 * 40e9) + 2 * 15 * 5e-6  # 620.75 us
        self.assertAlmostEqual(flat, 620.75e-6, places=12)
        self.assertAlmostEqual(2e-6 + intra + min(ring2, tree2), 626e-6, places=12)
        self.assertEqual(algo, "ring")
        self.assertAlmostEqual(t, flat, places=12)
        # 64 KiB: latency-bound; the hierarchy's 2 steps between nodes beat the flat ring's 30.
        t, algo = f.allreduce(16, 65536)
        intra = 2 * (7 / 8 * 65536 / 400e9 + 7 * 1e-6)
        ring2 = 2 * 1 / 2 * 8192 / 40e9 + 2 * 1 * 5e-6
        self.assertEqual(algo, "hier-ring")
        self.assertAlmostEqual(t, 2e-6 + intra + ring2, places=12)

    def test_fabric_many_nodes_small_message_takes_the_tree(self):
        # 1024 GPUs, 4 KB: latency-bound, the tree's 2*7 steps beat the ring's 2*127 between nodes.
        t, algo = self.fabric().allreduce(1024, 4096)
        self.assertEqual(algo, "hier-tree")

    def test_expected_max_normal(self):
        self.assertEqual(sm.expected_max_normal(1), 0.0)
        self.assertAlmostEqual(sm.expected_max_normal(2), 1 / math.sqrt(math.pi), places=4)
        self.assertAlmostEqual(sm.expected_max_normal(3), 1.5 / math.sqrt(math.pi), places=4)


class Overlap(unittest.TestCase):
    def test_fifo_queue_by_hand(self):
        # Buckets ready at 1, 2, 3 ms of a 3 ms backward, 2 ms each on one channel:
        # 1-3, 3-5, 5-7: 4 ms exposed after backward.
        e, spans = sm.simulate([1, 2, 3], [2, 2, 2], 3)
        self.assertEqual(spans, [(1, 3), (3, 5), (5, 7)])
        self.assertEqual(e, 4)
        # A control word of 1 ms after the last bucket on the same channel, or beside it.
        self.assertEqual(sm.simulate([1, 2, 3], [2, 2, 2], 3, tail=1)[0], 5)
        self.assertEqual(sm.simulate([1, 2, 3], [2, 2, 2], 3, tail=1, tail_parallel=True)[0], 4)
        # Without overlap everything starts at the end of backward: 3-5-7-9.
        self.assertEqual(sm.simulate([1, 2, 3], [2, 2, 2], 3, overlap=False)[0], 6)
        # A channel fast enough hides all but the last bucket.
        self.assertAlmostEqual(sm.simulate([1, 2, 3], [0.5, 0.5, 0.5], 3)[0], 0.5)

    def test_step_sum(self):
        compute = {"forward": 1.0, "backward": 2.0, "optimizer": 0.5, "other": 0.25}
        link = sm.MeasuredLink([4, 1e6], [0.1, 0.6])  # 0.5 s per MB above the 0.1 s fixed part
        r1 = sm.predict_step(1, compute, [1e6], [1.0], link)
        self.assertEqual(r1["step"], 3.75)  # one rank: no all-reduce
        r2 = sm.predict_step(2, compute, [1e6], [1.0], link)
        # The bucket is ready at the end of backward: 0.5 s of it + 0.1 s fixed, exposed.
        self.assertAlmostEqual(r2["exposed"], 0.6, places=9)
        self.assertAlmostEqual(r2["step"], 4.35, places=9)


class Plan(unittest.TestCase):
    def test_bucket_cuts_by_hand(self):
        # Floats; caps: first 1000 bytes = 250 floats, others 2000 bytes = 500 floats.
        counts = [100, 100, 400, 300, 50, 60, 20]
        t, off = [], 0
        for i, c in enumerate(counts):
            t.append({"name": "t%d" % i, "layer": "l%d" % i, "offset": off, "count": c})
            off += c
        b = sm.plan_buckets(t, off, cap_bytes=2000, first_cap_bytes=1000)
        # tail: t6 (20) + t5 (60) + t4 (50) = 130 <= 250, + t3 would be 430: tail starts at t4.
        # first: t0 + t1 = 200 <= 250 (t2 would pass it); then t2 (400; + t3 = 700 > 500); t3; tail t4..t6.
        self.assertEqual([(x["t0"], x["t1"]) for x in b], [(0, 2), (2, 3), (3, 4), (4, 7)])
        self.assertEqual(sum(x["count"] for x in b), off)

    def test_alignment_and_order(self):
        net = sm.build_model("mnist-net")
        tensors, total = sm.gradient_layout(net)
        self.assertEqual([e["name"] for e in tensors][:2], ["fc2.weight", "fc2.bias"])  # backward order
        self.assertTrue(all(e["offset"] % 64 == 0 for e in tensors))
        self.assertEqual(total % 64, 0)

    def test_parameter_counts(self):
        # torchvision resnet18 / resnet50 (1000 classes), WRN-28-10 on CIFAR-10, the PyTorch MNIST example on 3x32x32.
        self.assertEqual(sm.build_model("resnet18", 1000, 3, 224, 224).params(), 11689512)
        self.assertEqual(sm.build_model("resnet50", 1000, 3, 224, 224).params(), 25557032)
        self.assertEqual(sm.build_model("wrn-28-10", 10).params(), 36479194)
        self.assertEqual(sm.build_model("mnist-net", 10).params(), 1626442)
        # Forward multiply-adds at 224x224: 1.81 G and 4.09 G, as commonly quoted.
        self.assertAlmostEqual(sm.build_model("resnet18", 1000, 3, 224, 224).macs() / 1e9, 1.814, delta=0.01)
        self.assertAlmostEqual(sm.build_model("resnet50", 1000, 3, 224, 224).macs() / 1e9, 4.089, delta=0.02)

    def test_ready_fractions(self):
        net = sm.build_model("resnet18")
        tensors, _ = sm.gradient_layout(net)
        for how in ("flops", "params"):
            f = sm.ready_fractions(net, tensors, how)
            self.assertEqual(f, sorted(f))  # backward order: never earlier than the tensor before
            self.assertAlmostEqual(f[-1], 1.0)


class Link(unittest.TestCase):
    def test_interpolation(self):
        lk = sm.MeasuredLink([4, 1000, 1000000], [1e-4, 2e-4, 1.1e-3])
        self.assertAlmostEqual(lk.total(1000), 2e-4)
        self.assertAlmostEqual(lk.bucket(1000000), 1e-3)
        self.assertAlmostEqual(lk.bucket(2), 0.0)
        # Beyond the largest size: its last bandwidth (0.9 ms per 999 KB).
        self.assertAlmostEqual(lk.total(1999000), 1.1e-3 + 0.9e-3, places=9)
        # log-log between points: sqrt(1000 * 1e6) bytes at sqrt(2e-4 * 1.1e-3) s.
        self.assertAlmostEqual(lk.total(math.sqrt(1e9)), math.sqrt(2e-4 * 1.1e-3), places=9)


class Predict(unittest.TestCase):
    def test_table(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            with redirect_stdout(io.StringIO()):
                rc = sm.main(["predict", "--model", "resnet50,wrn-28-10", "--gpus", "1,8,16,1024", "--json", path])
            self.assertEqual(rc, 0)
            with open(path) as f:
                res = json.load(f)
        for name, m in res["models"].items():
            rows = m["rows"]
            self.assertEqual(rows[0]["gpus"], 1)
            self.assertEqual(rows[0]["efficiency"], 1.0)
            self.assertEqual(rows[0]["exposed_s"], 0.0)
            effs = [r["efficiency"] for r in rows]
            self.assertEqual(effs, sorted(effs, reverse=True), name)
            self.assertTrue(all(0 < e <= 1 for e in effs))
            self.assertAlmostEqual(rows[-1]["images_per_s"], 1024 * m["batch"] / rows[-1]["step_s"])
        self.assertEqual(res["models"]["resnet50"]["params"], 25557032)


if __name__ == "__main__":
    r = unittest.main(exit=False, verbosity=1).result
    sys.exit(0 if r.wasSuccessful() else 1)
