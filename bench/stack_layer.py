#!/usr/bin/env python3
"""bench/stack_layer.py SRC DST N [links]: the OCI layout SRC (one image,
as bench/modes.sh makes it, or one this script made) with one gzip layer
on top, written as DST: the layer rewrites N of the first layer's files
(every 50th of the first 50*N, new bytes and a newer mtime); with `links`,
it hardlinks each of them instead, as PATH.lK (K: the layers below).
DST's blobs are hardlinks to SRC's where they are the same. What an image
update that only adds layers looks like (`resume`)."""
import gzip, hashlib, io, json, os, shutil, sys, tarfile

src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
links = sys.argv[4:] == ["links"]
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst + "/blobs/sha256")
for b in os.listdir(src + "/blobs/sha256"):
    os.link(f"{src}/blobs/sha256/{b}", f"{dst}/blobs/sha256/{b}")
shutil.copy(src + "/oci-layout", dst)
idx = json.load(open(src + "/index.json"))
mdesc = idx["manifests"][0]
man = json.load(open(src + "/blobs/sha256/" + mdesc["digest"][7:]))
cfg = json.load(open(src + "/blobs/sha256/" + man["config"]["digest"][7:]))
paths = []
with tarfile.open(src + "/blobs/sha256/" + man["layers"][0]["digest"][7:], "r|gz") as t:
    for m in t:
        if m.isfile():
            paths.append(m.name)
            if len(paths) >= n * 50:
                break
paths = paths[::50][:n]
inner = io.BytesIO()
with tarfile.open(fileobj=inner, mode="w", format=tarfile.PAX_FORMAT) as t:
    for p in paths:
        if links:
            ti = tarfile.TarInfo(f"{p}.l{len(man['layers'])}")
            ti.type, ti.linkname, ti.mtime, ti.mode = tarfile.LNKTYPE, p, 1700000001, 0o644
            t.addfile(ti)
            continue
        data = b"changed " + p.encode() + b"\n"
        ti = tarfile.TarInfo(p)
        ti.size, ti.mtime, ti.mode = len(data), 1700000001, 0o644
        t.addfile(ti, io.BytesIO(data))
tb = inner.getvalue()
raw = io.BytesIO()
with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
    gz.write(tb)


def put(data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{dst}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + d, "size": len(data)}


layer = put(raw.getvalue())
layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
cfg["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(tb).hexdigest())
c = put(json.dumps(cfg).encode())
c["mediaType"] = man["config"]["mediaType"]
man["config"] = c
man["layers"].append(layer)
m = put(json.dumps(man).encode())
m["mediaType"] = mdesc["mediaType"]
m["annotations"] = mdesc["annotations"]
with open(dst + "/index.json", "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [m]}, f)
