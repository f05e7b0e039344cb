"""Remote restore benchmark: ckptmerge's ranged reads from S3 vs "download, then restore from disk".

Workload (issue 12): one TF checkpoint of 512 MiB, 88 float32 tensors (24 of 4096x1024 = 16 MiB,
64 of 512x1024 = 2 MiB), written once by ckptmerge's BundleWriter, served by a local S3 server,
restored in eager mode into the same 88 ``tf.Variable`` s by two contenders, interleaved round by
round in this one process (medians of ROUNDS rounds, after one warm-up each):

- ckptmerge: ``cm.plan(variables, [cm.Source("s3://bench/run/model")]).restore()``: the index is
  fetched once, the tensors by ranged GETs, several in flight (``CKPTMERGE_REMOTE_CONCURRENCY``);
- baseline: ``s3fs.S3FileSystem.get`` of the index and data objects into a fresh local temporary
  directory, then the same ckptmerge plan and restore from that local checkpoint (the same restore
  code for the local part; the download is the only difference). The temporary directory is
  removed outside the timing.

The server. moto's S3 server (``ThreadedMotoServer``) reads a whole object for every GET and slices
the range afterwards (about 0.12 s per request on a 256 MiB object), which would make many small
ranged reads look slow and a few huge ones fast: the opposite of a real bucket. So the server runs
in a child process with a small patch of moto's ``S3Response.get_object``: a GET with a single
``Range`` reads only those bytes from the object's file-backed buffer (moto spools objects larger
than 5 MiB to a temporary file). On top of that it applies a **cost model** of a real object store
(printed with the results), to every GET, ranged or not:

    time of a GET >= first_byte_latency + bytes / per_connection_bandwidth

(the server holds the answer until that much time has passed since the request arrived; its own
work counts toward it; the loopback transfer comes on top). Other requests (HEAD, LIST) cost the
latency. Two models run by default:

- ``range-proportional``: no simulated costs, only what the patched server really spends (a ranged
  GET costs what its range costs);
- ``object-store``: 30 ms first-byte latency, 100 MiB/s per connection: the shape of a real bucket
  (AWS's S3 performance guidelines quote roughly 100-200 ms first-byte latency for small objects,
  and one connection reaches on the order of 100 MB/s; they recommend parallel ranged GETs for
  throughput. The model is deliberately milder on latency than that.)

Run: python scripts/bench_remote.py [--rounds 5] [--dir /tmp/ckptmerge-bench-remote]
     [--latency-ms 30] [--bandwidth-mib 100] [--models range-proportional,object-store]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

BIG, SMALL = (24, (4096, 1024)), (64, (512, 1024))  # 24 x 16 MiB + 64 x 2 MiB = 512 MiB
BUCKET, KEY_PREFIX = "bench", "run/model"


# -- the server (child process) ----------------------------------------------------------------


def serve(port: int, model_file: str) -> None:
    """Run moto's S3 server with ranged GETs read from the object's file and the cost model applied."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.s3.responses import S3Response

    def model() -> dict:
        with open(model_file) as f:
            return json.load(f)

    original_get = S3Response.get_object
    original_key = S3Response.key_response
    original_bucket = S3Response.bucket_response

    def ranged_get_object(self):
        spec = self.headers.get("range") or ""
        if not spec.startswith("bytes=") or "," in spec or self.headers.get("if-none-match") \
                or self.headers.get("if-modified-since"):
            return original_get(self)  # whole object (the baseline's download) or a rare form
        begin_s, _, end_s = spec[6:].partition("-")
        if not begin_s:
            return original_get(self)
        key, _ = self._get_key()
        size = key.size
        begin, end = int(begin_s), min(int(end_s) if end_s else size - 1, size - 1)
        if begin >= size or begin > end:
            return original_get(self)
        with key.lock:  # only the requested bytes, from moto's spooled file
            key._value_buffer.seek(begin)
            data = key._value_buffer.read(end - begin + 1)
        headers = self._get_cors_headers_other()
        headers.update(key.response_dict)
        headers.update(key.metadata)
        headers["Accept-Ranges"] = "bytes"
        headers["content-range"] = f"bytes {begin}-{end}/{size}"
        return 206, headers, data  # not 200: key_response leaves it alone

    def costed(original):
        def handler(self, request, full_url, headers):
            t0 = time.perf_counter()
            status, out_headers, body = original(self, request, full_url, headers)
            m = model()
            n = len(body) if request.method == "GET" and isinstance(body, (bytes, bytearray)) else 0
            wait = m["latency_ms"] / 1000 + (n / (m["bandwidth_mib"] * 2**20) if m["bandwidth_mib"] else 0)
            rest = wait - (time.perf_counter() - t0)
            if rest > 0:
                time.sleep(rest)
            return status, out_headers, body
        return handler

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    S3Response.get_object = ranged_get_object
    S3Response.key_response = costed(original_key)
    S3Response.bucket_response = costed(original_bucket)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


# -- the benchmark (parent process) ------------------------------------------------------------


def names_and_shapes() -> list:
    out = [(f"big{i:02d}", BIG[1]) for i in range(BIG[0])]
    return out + [(f"small{i:02d}", SMALL[1]) for i in range(SMALL[0])]


def write_checkpoint(root: str) -> str:
    """The 512 MiB checkpoint, written once by ckptmerge's BundleWriter (reused across runs)."""
    from ckptmerge.formats.tf.writer import BundleWriter

    prefix = os.path.join(root, "model")
    if not os.path.exists(prefix + ".index"):
        os.makedirs(root, exist_ok=True)
        rng = np.random.default_rng(0)
        with BundleWriter(prefix) as w:
            for name, shape in names_and_shapes():
                w.add(name, rng.standard_normal(shape, dtype=np.float32))
    return prefix


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_model(path: str, latency_ms: float, bandwidth_mib: float) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"latency_ms": latency_ms, "bandwidth_mib": bandwidth_mib}, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ckptmerge-bench-remote"))
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--bandwidth-mib", type=float, default=100.0)
    parser.add_argument("--models", default="range-proportional,object-store")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.model_file)
        return

    prefix = write_checkpoint(args.dir)
    model_file = os.path.join(args.dir, "cost-model.json")
    set_model(model_file, 0, 0)
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--model-file", model_file],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the S3 server did not start")
        run(args, prefix, model_file, port, env)
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def run(args, prefix: str, model_file: str, port: int, env: dict) -> None:
    import fsspec

    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    endpoint = f"http://127.0.0.1:{port}"
    fsspec.config.conf["s3"] = {"client_kwargs": {"endpoint_url": endpoint}}
    import s3fs
    import tensorflow as tf

    import ckptmerge as cm
    from ckptmerge.formats import storage

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.mkdir(BUCKET)
    local_files = sorted(n for n in os.listdir(args.dir) if n.startswith("model."))
    for n in local_files:  # multipart uploads for the data object
        fs.put_file(os.path.join(args.dir, n), f"{BUCKET}/{os.path.dirname(KEY_PREFIX)}/{n}")
    url = f"s3://{BUCKET}/{KEY_PREFIX}"
    remote_files = [f"{BUCKET}/{os.path.dirname(KEY_PREFIX)}/{n}" for n in local_files]
    total = sum(os.path.getsize(os.path.join(args.dir, n)) for n in local_files)

    variables = {name: tf.Variable(tf.zeros(shape, tf.float32), name=name) for name, shape in names_and_shapes()}
    check = names_and_shapes()[0][0], names_and_shapes()[-1][0]
    expected = {n: cm.load(prefix, [n])[n] for n in check}

    def ckptmerge_remote() -> None:
        cm.plan(variables, [cm.Source(url)]).restore()

    scratch = []

    def download_then_restore() -> None:
        d = tempfile.mkdtemp(prefix="bench-remote-dl-")
        scratch.append(d)
        fs.get(remote_files, [os.path.join(d, os.path.basename(f)) for f in remote_files])
        cm.plan(variables, [cm.Source(os.path.join(d, "model"))]).restore()

    def clean() -> None:
        while scratch:
            shutil.rmtree(scratch.pop(), ignore_errors=True)

    models = {"range-proportional": (0.0, 0.0), "object-store": (args.latency_ms, args.bandwidth_mib)}
    print(f"checkpoint: {len(variables)} float32 tensors, {total / 2**20:.0f} MiB in {len(local_files)} objects "
          f"({BIG[0]} x {BIG[1]}, {SMALL[0]} x {SMALL[1]}); eager restore into tf.Variables")
    print(f"server: moto {__import__('moto').__version__} in a child process, ranged GETs read only their "
          f"range from the object's spooled file; s3fs {s3fs.__version__}, "
          f"CKPTMERGE_REMOTE_CONCURRENCY={storage.REMOTE_CONCURRENCY}; {os.cpu_count()} CPUs")
    print("baseline: s3fs get of every object to a local temp dir, then the same ckptmerge restore from disk")
    print()
    print(f"{'cost model':<68} {'ckptmerge':>10} {'baseline':>10} {'ratio':>7}")
    for label in args.models.split(","):
        latency, bandwidth = models[label]
        set_model(model_file, latency, bandwidth)
        described = (f"{label}: per GET >= {latency:g} ms + bytes / {bandwidth:g} MiB/s per connection"
                     if bandwidth else f"{label}: no simulated latency or bandwidth limit")
        times = {"ckptmerge": [], "baseline": []}
        contenders = [("ckptmerge", ckptmerge_remote), ("baseline", download_then_restore)]
        for fn in (ckptmerge_remote, download_then_restore):  # warm-up
            fn()
            clean()
        for r in range(args.rounds):
            for k, fn in (contenders if r % 2 == 0 else contenders[::-1]):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
                clean()
        for n in check:
            np.testing.assert_array_equal(variables[n].numpy(), expected[n])
        a, b = statistics.median(times["ckptmerge"]), statistics.median(times["baseline"])
        print(f"{described:<68} {a:>9.2f}s {b:>9.2f}s {a / b:>6.2f}x", flush=True)
    print()
    print(f"(medians of {args.rounds} rounds, order alternating; target: ckptmerge <= 0.7x the baseline)")


if __name__ == "__main__":
    main()
