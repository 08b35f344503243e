#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ (run once; the files are committed).

Seeds are written from the format descriptions (docs/wire.md, include/deloco/wire.h, the safetensors and
manifest formats), not by the code under test, so they are independent of it."""
import json, os, struct

here = os.path.dirname(os.path.abspath(__file__))

def fnv1a64(b):
    h = 0xcbf29ce484222325
    for c in b:
        h ^= c
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

def frame(kind, enc, payload, elements, learner=0, frag=0, fp=0x1234, rnd=0, steps=0, tokens=0, version=1):
    head = b"DLCW" + struct.pack("<HBBIIQQQQQQQ", version, kind, enc, learner, frag, fp, rnd, steps, tokens,
                                 elements, len(payload), fnv1a64(payload))
    assert len(head) == 72
    return head + payload

def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# --- wire: a mode byte (0: the target fixes the checksum) then a frame --------------------------------------------
floats = struct.pack("<8f", 0.5, -1.25, 3.0, 0.0, 1e-3, -7.5, 2.0, 0.125)
hello = json.dumps({"learner": 1, "fingerprint": "0000000000001234", "instance": "00000000000000ab",
                    "restarts": 0, "want_state": True}).encode()
seeds = {
    "hello": frame(1, 0, hello, len(hello)),
    "heartbeat": frame(6, 0, b"", 0),
    "leave": frame(7, 0, b"done", 4),
    "reject": frame(8, 0, b"stale base", 10),
    "push_fp32": frame(4, 1, floats, 8, learner=1, frag=2, rnd=5, steps=10, tokens=640),
    "push_bf16": frame(4, 2, bytes(16), 8, frag=1),
    "push_int8": frame(4, 3, struct.pack("<f", 0.05) + bytes([1, 2, 255, 128, 0, 7, 9, 127]), 8),
    "push_int4": frame(4, 4, struct.pack("<f", 0.5) + bytes([0x12, 0x7f, 0x88, 0x01]), 8),
    "broadcast_fp32": frame(5, 1, floats, 8, rnd=3),
    "state_chunk": frame(3, 1, floats[:16], 4),
    "welcome": frame(2, 0, b'{"round":1,"chunks":2}', 22),
}
for name, f in seeds.items():
    write("fuzz_wire", name, b"\x00" + f)
write("fuzz_wire", "bad_checksum", b"\x01" + seeds["push_fp32"])
write("fuzz_wire", "short", b"\x00DLCW\x01\x00")

# --- codecs: encoding byte, u16 element count, payload ---------------------------------------------------------------
write("fuzz_codecs", "fp32", bytes([0]) + struct.pack("<H", 8) + floats)
write("fuzz_codecs", "bf16", bytes([1]) + struct.pack("<H", 8) + bytes(range(16)))
write("fuzz_codecs", "int8", bytes([2]) + struct.pack("<H", 8) + struct.pack("<f", 0.1) + bytes(range(8)))
write("fuzz_codecs", "int4", bytes([3]) + struct.pack("<H", 8) + struct.pack("<f", 0.1) + bytes(range(4)))
write("fuzz_codecs", "int8_nan_scale", bytes([2]) + struct.pack("<H", 2) + struct.pack("<f", float("nan")) + b"\x01\x02")
write("fuzz_codecs", "many", bytes([2]) + struct.pack("<H", 130) + struct.pack("<3f", 1, 2, 3) + bytes(130))

# --- topk: mode byte (bits 0-1 encoding topk8/4/2/2b, bits 2-5 density, bit 6 chunked), u16 element count, payload ----
# A payload (docs/wire.md): u32 k, the k values as int8/int4/int2 blocks (fp32 scale per 64, then codes), then k
# indices as LEB128 gaps (the first index itself).
def topk8(indices, codes, scale=0.5):
    gaps, prev = b"", None
    for i in indices:
        v = i if prev is None else i - prev
        while v >= 0x80:
            gaps += bytes([(v & 0x7F) | 0x80]); v >>= 7
        gaps += bytes([v]); prev = i
    return struct.pack("<I", len(indices)) + struct.pack("<f", scale) + bytes(c & 0xFF for c in codes) + gaps
write("fuzz_topk", "three", bytes([0]) + struct.pack("<H", 300) + topk8([2, 130, 299], [1, -3, 127]))
write("fuzz_topk", "empty", bytes([0]) + struct.pack("<H", 16) + struct.pack("<I", 0))
write("fuzz_topk", "duplicate", bytes([0]) + struct.pack("<H", 16) + topk8([4, 4], [1, 1]))
write("fuzz_topk", "out_of_range", bytes([0]) + struct.pack("<H", 16) + topk8([3, 16], [1, 1]))
write("fuzz_topk", "truncated", bytes([0]) + struct.pack("<H", 300) + topk8([2, 130, 299], [1, -3, 127])[:-1])
write("fuzz_topk", "huge_count", bytes([0]) + struct.pack("<H", 16) + struct.pack("<I", 0xFFFFFFFF) + bytes(8))
# topk4 (mode 1): two values in one byte; topk2 (mode 2, chunked, density bits set): four per byte.
write("fuzz_topk", "topk4", bytes([1]) + struct.pack("<H", 40) + struct.pack("<I", 2) + struct.pack("<f", 0.25) +
      bytes([0x9F]) + bytes([5, 20]))
write("fuzz_topk", "topk2_floats", bytes([2 | (7 << 2) | 0x40]) + struct.pack("<H", 64) +
      struct.pack("<16f", *[((-1) ** i) * (i + 1) * 0.1 for i in range(16)]))

# --- config: TOML plus --set lines -------------------------------------------------------------------------------------
write("fuzz_config", "basic", b'[a]\nint = 4\nreal = 1.5\nflag = true\ntext = "hi"\n[b]\nints = [1, 2, 3]\nreals = [0.5]\n')
write("fuzz_config", "overrides", b'[a]\nint = 1\n--set a.real=2.5\n--set b.ints=4,5\n--set a.flag=false\n')
write("fuzz_config", "goodput", b'[goodput]\nchips = [1000, 2000]\n')
write("fuzz_config", "bad_type", b'[a]\nint = 1.5\n')
write("fuzz_config", "unknown", b'[a]\nnope = 1\n')
write("fuzz_config", "inf", b'[a]\nreal = inf\n--set a.real=nan\n')

# --- safetensors header: a whole file image ----------------------------------------------------------------------------
def safetensors(header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data

write("fuzz_safetensors", "two", safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                              "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]},
                                              "__metadata__": {"k": "v"}}, bytes(12)))
write("fuzz_safetensors", "overflow", safetensors({"a": {"dtype": "F32", "shape": [2**62], "data_offsets": [0, 0]}}, b""))
write("fuzz_safetensors", "empty", safetensors({}, b""))

# --- checkpoint manifest (JSON text) -------------------------------------------------------------------------------------
man = {"format": "deloco-checkpoint", "version": 1, "step": 10, "kind": "syncer",
       "files": {"model.safetensors": {"bytes": 100, "fnv1a64": "0123456789abcdef"}}}
write("fuzz_manifest", "v1", json.dumps(man).encode())
man2 = dict(man)
man2["version"] = 2
man2["sequence"] = 7
man2["files"] = {"model.safetensors": {"bytes": 100, "hash": "blake2b-256", "digest": "00" * 32},
                 "optimizer.safetensors": {"bytes": 5, "hash": "blake2b-256", "digest": "11" * 32}}
write("fuzz_manifest", "v2", json.dumps(man2).encode())
write("fuzz_manifest", "junk", b'{"format": 3, "files": [1, 2]}')

# --- run records (JSON lines of deloco run/sim/train, docs/report.md): a file byte, a cut byte, then the text ------
def records(*recs):
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode()

syncer = records({"kind": "started", "t": 100.0, "resumed": True, "shard": 1, "shards": 2},
                 {"kind": "status", "t": 101.0, "connected": [0, 3], "merges": 2, "uptime": 0.9, "goodput": 0.8,
                  "bytes_out": 1000, "tokens": 4096},
                 {"kind": "merge", "t": 102.0, "learners": [0, 3], "grace_wait": 0.25},
                 {"kind": "eval", "t": 102.5, "val_loss": 4.9, "val_bpb": 1.7, "tokens": 2000},
                 {"kind": "reject", "t": 103.0, "reason": "stale"},
                 {"kind": "chaos", "t": 103.5, "what": "chaos: SIGKILL learner 3"},
                 {"kind": "syncer_pause", "t": 104.0}, {"kind": "syncer_resume", "t": 105.0})
write("fuzz_report", "syncer", bytes([0, 128]) + syncer)
write("fuzz_report", "syncer_shards_torn", bytes([2, 200]) + syncer[:-7])
learner = records({"kind": "welcome", "t": 10.0, "learner": 3}, {"kind": "learner", "t": 11.0, "step": 10,
                                                                   "loss": 5.5, "tokens": 1000},
                  {"kind": "push", "t": 11.5}, {"kind": "alone", "t": 12.0},
                  {"kind": "learner_done", "t": 13.0}, {"kind": "train", "elapsed_s": 2.0, "loss": 5.1})
write("fuzz_report", "learner", bytes([1, 60]) + learner)
write("fuzz_report", "mistyped", bytes([0, 255]) + records({"kind": "started", "t": 1, "resumed": "yes"},
                                                              {"kind": "status", "t": "x", "shard": "y"},
                                                              {"kind": "fail", "t": 2, "learner": 1e300}))

# --- run-record bounds: a max-points byte, a files byte (bit 0: learner file, bit 1: also summary.json), the text;
# each 0x01 byte stands for 300 KiB of 'x' (fuzz_report_bounds.cpp) ------------------------------------------------
write("fuzz_report_bounds", "absurd_times", bytes([10, 0]) + records(
    {"kind": "eval", "t": 100, "val_loss": 5.0, "val_bpb": 1.5}, {"kind": "merge", "t": 1e8, "learners": [0]},
    {"kind": "merge", "t": 1e300, "learners": [0]}, {"kind": "merge", "t": -5, "learners": [0]},
    {"kind": "merge", "t": 1e9, "learners": [0]}, {"kind": "train", "elapsed_s": 1e10, "loss": 4.0}))
write("fuzz_report_bounds", "absurd_times_unthinned", bytes([0, 0]) + records(
    {"kind": "merge", "t": 0, "learners": [0]}, {"kind": "merge", "t": 9.9e9, "learners": [0, 1]}))
write("fuzz_report_bounds", "long_line", bytes([5, 1]) + b'{"kind":"learner","t":1,"loss":5.0}\n'
      b'{"kind":"chaos","t":2,"what":"' + b"\x01\x01\x01\x01" + b'"}\n{"kind":"learner","t":3,"loss":4.0}\n'
      b'{"kind":"chaos","t":4,"what":"' + b"\x01")
write("fuzz_report_bounds", "markup", bytes([3, 0]) + records(
    {"kind": "chaos", "t": 1, "what": "<!--<script>"}, {"kind": "chaos", "t": 2, "what": "</script><b>&amp;\u2028\u2029"},
    {"kind": "reject", "t": 3, "reason": "<img src=x onerror=alert(1)>"},
    {"kind": "status", "t": 4, "connected": [0, "x"], "uptime": "<i>"},
    {"final_val_loss": "<img src=x onerror=alert(1)>", "command": 5, "uptime": 0.5}))
write("fuzz_report_bounds", "many_events", bytes([2, 0]) + records(
    *[{"kind": "chaos", "t": i, "what": "chaos: SIGKILL learner %d" % i} for i in range(40)],
    *[{"kind": "reject", "t": i, "reason": "r%d" % i} for i in range(80)]))
write("fuzz_report_bounds", "summary_types", bytes([4, 2]) + records(
    {"kind": "note", "t": 1, "final_val_loss": "<img src=x onerror=alert(1)>", "command": 5, "uptime": 0.5,
     "loss_unit": "\u2028</script>", "learners": [{"steps": 1}], "rejects": {"<b>": 3, "x": "y"}}))
