//! Images and archives as the container runtime sees them: an archive
//! re-synced unchanged is up to date without being unpacked (and drift is
//! still repaired), `--platform` matches index entries as containerd does,
//! the layer shortcut holds when a new layer rewrites one member of a
//! hardlink group, and `oci-archive:`/`docker-archive:` FILEs are image
//! sources. Every archive and layout is written by the test itself
//! (python3's tarfile and the layout writer of `source_oci`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use crate::fixture::{json, links, Fixture};
use crate::source_oci::{have, tree};

/// A tar of `entries` (`{"name", "type": file|dir|hardlink|symlink,
/// "data", "target"}` as JSON), gzip-compressed when `gz`.
fn tar_of(entries: &str, gz: bool) -> Vec<u8> {
    let script = r#"
import gzip, io, json, sys, tarfile
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
    for e in json.load(sys.stdin):
        i = tarfile.TarInfo(e["name"])
        i.mtime = e.get("mtime", 1700000000)
        kind = e.get("type", "file")
        i.mode = 0o755 if kind == "dir" else 0o644
        if kind == "dir":
            i.type = tarfile.DIRTYPE
            t.addfile(i)
        elif kind in ("hardlink", "symlink"):
            i.type = tarfile.LNKTYPE if kind == "hardlink" else tarfile.SYMTYPE
            i.linkname = e["target"]
            t.addfile(i)
        else:
            data = e.get("data", "").encode()
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
raw = out.getvalue()
sys.stdout.buffer.write(gzip.compress(raw, mtime=0) if sys.argv[1] == "1" else raw)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, if gz { "1" } else { "0" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(entries.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 tarfile failed");
    out.stdout
}

/// `packsync sync --grace 0 --json --itemize SOURCE vol/packs`.
fn sync_json(f: &Fixture, source: &str) -> serde_json::Value {
    let run = f
        .packsync(&[
            "sync",
            "--grace",
            "0",
            "--json",
            "--itemize",
            source,
            "vol/packs",
        ])
        .ok();
    json(&run)
}

#[test]
fn an_unchanged_archive_is_up_to_date_without_unpacking_and_drift_is_repaired() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let entries = r#"[{"name":"app","type":"dir"},
        {"name":"app/a.py","data":"a = 1\n"},{"name":"app/b.py","data":"b = 2\n"},
        {"name":"app/b-link.py","type":"hardlink","target":"app/b.py"},
        {"name":"app/latest","type":"symlink","target":"a.py"}]"#;
    fs::write(f.path("bundle.tar.gz"), tar_of(entries, true)).unwrap();
    let first = sync_json(&f, "bundle.tar.gz");
    assert_eq!(first["status"], "synced", "{first}");
    let want = tree(&f.dest());
    let want_links = links(&f.dest());
    assert_eq!(want_links.len(), 1, "{want_links:?}");

    // The same bytes again: up to date, nothing copied, and nothing written
    // on the volume at all (no spool made in a staging directory), even
    // with the archive's own mtime moved.
    let archive = f.path("bundle.tar.gz");
    crate::fixture::set_mtime(&archive, 1_800_000_000, 0);
    let again = f.unchanged_by(|| {
        f.packsync(&[
            "sync",
            "--grace",
            "0",
            "--json",
            "--itemize",
            "bundle.tar.gz",
            "vol/packs",
        ])
        .ok()
    });
    let again = json(&again);
    assert_eq!(again["status"], "up to date", "{again}");
    assert_eq!(again["copied"], 0, "{again}");
    assert_eq!(again["changes"], serde_json::json!([]), "{again}");

    // Drift: a live file edited in place is repaired by the same archive.
    let live = fs::canonicalize(f.dest()).unwrap();
    fs::write(live.join("app/a.py"), "edited in the live tree\n").unwrap();
    let repaired = sync_json(&f, "bundle.tar.gz");
    assert_eq!(repaired["status"], "synced", "{repaired}");
    assert_eq!(tree(&f.dest()), want);
    assert_eq!(links(&f.dest()), want_links);
    assert_eq!(sync_json(&f, "bundle.tar.gz")["status"], "up to date");

    // Drift in the hardlinks alone: the two links of b.py made two files
    // (same bytes, mode and mtime) is repaired too.
    let live = fs::canonicalize(f.dest()).unwrap();
    let link = live.join("app/b-link.py");
    let m = fs::metadata(&link).unwrap();
    let app = fs::metadata(live.join("app")).unwrap();
    fs::remove_file(&link).unwrap();
    fs::copy(live.join("app/b.py"), &link).unwrap();
    crate::fixture::set_mtime(&link, m.mtime(), m.mtime_nsec() as u32);
    let at = live.join("app");
    crate::fixture::set_mtime(&at, app.mtime(), app.mtime_nsec() as u32);
    assert!(links(&f.dest()).is_empty());
    let relinked = sync_json(&f, "bundle.tar.gz");
    assert_eq!(relinked["status"], "synced", "{relinked}");
    assert_eq!(links(&f.dest()), want_links);
    assert_eq!(sync_json(&f, "bundle.tar.gz")["status"], "up to date");

    // The same archive, another //PATH: another tree, not up to date.
    let sub = sync_json(&f, "bundle.tar.gz//app");
    assert_eq!(sub["status"], "synced", "{sub}");
    assert!(f.dest().join("a.py").exists());
    assert_eq!(sync_json(&f, "bundle.tar.gz//app")["status"], "up to date");
    let whole = sync_json(&f, "bundle.tar.gz");
    assert_eq!(whole["status"], "synced", "{whole}");
    assert_eq!(tree(&f.dest()), want);

    // Other bytes under the same name: published.
    let changed = entries.replace("a = 1", "a = 3");
    fs::write(&archive, tar_of(&changed, true)).unwrap();
    let next = sync_json(&f, "bundle.tar.gz");
    assert_eq!(next["status"], "synced", "{next}");
    assert_eq!(
        fs::read_to_string(f.dest().join("app/a.py")).unwrap(),
        "a = 3\n"
    );
}

/// One image per platform, each a single file naming it, under tag `multi`.
fn multi_platform(platforms: &[(&str, &str, Option<&str>)]) -> String {
    let images: Vec<String> = platforms
        .iter()
        .map(|(os, arch, variant)| {
            let v = variant.map_or(String::new(), |v| format!(r#","variant":"{v}""#));
            let name = format!("{os}-{arch}-{}", variant.unwrap_or("none"));
            format!(
                r#"{{"os":"{os}","arch":"{arch}"{v},"layers":[{{"compression":"gzip","entries":[{{"name":"platform","data":"{name}"}}]}}]}}"#
            )
        })
        .collect();
    format!(r#"[{{"tag":"multi","platforms":[{}]}}]"#, images.join(","))
}

#[test]
fn platform_variants_match_as_containerd_matches_them() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    // What `buildah manifest add` writes: arm64 without a variant; arm/v6
    // listed before arm/v7.
    crate::source_oci::write_layout(
        &layout,
        &multi_platform(&[
            ("linux", "amd64", None),
            ("linux", "arm64", None),
            ("linux", "arm", Some("v6")),
            ("linux", "arm", Some("v7")),
        ]),
        "multi",
    );
    let src = format!("oci-layout:{}:multi", layout.display());
    for (i, (asked, want)) in [
        ("linux/arm64/v8", "linux-arm64-none"),
        ("linux/arm64", "linux-arm64-none"),
        ("linux/arm", "linux-arm-v7"),
        ("linux/arm/v6", "linux-arm-v6"),
    ]
    .into_iter()
    .enumerate()
    {
        let dest = format!("vol/p{i}");
        f.packsync(&["sync", "--grace", "0", "--platform", asked, &src, &dest])
            .ok();
        assert_eq!(
            tree(&f.path(&dest)),
            [format!("platform={want}")],
            "--platform {asked}"
        );
    }
    f.packsync(&["sync", "--platform", "linux/arm/v5", &src, "vol/none"])
        .fails(1, "no image for linux/arm/v5 in the index (it has linux/amd64, linux/arm64, linux/arm/v6, linux/arm/v7");
    assert!(!f.path("vol/none").exists());
}

/// The layer digests of the manifest `digest` in the layout `dir`.
fn layer_digests(dir: &std::path::Path, digest: &str) -> Vec<String> {
    let blob = |d: &str| {
        dir.join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap())
    };
    let m: serde_json::Value = serde_json::from_slice(&fs::read(blob(digest)).unwrap()).unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// Copy the layout `from` to `to` (a flat copy of its files).
fn copy_layout(from: &std::path::Path, to: &std::path::Path) {
    fs::create_dir_all(to.join("blobs/sha256")).unwrap();
    for name in ["oci-layout", "index.json"] {
        fs::copy(from.join(name), to.join(name)).unwrap();
    }
    for e in fs::read_dir(from.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join("blobs/sha256").join(e.file_name())).unwrap();
    }
}

#[test]
fn a_new_layer_rewriting_or_linking_to_a_lower_file_fetches_only_that_layer() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    // Lower layers: a group of three paths (h.py, h-link.py, h2.py), a
    // group of two (p.py, p-link.py), files apart. Each top layer (tags 2,
    // 3, 4) rewrites one member of a group, as a RUN step that writes one
    // path of a hardlinked file gives it (overlayfs copies that path up
    // alone), and tag 4 also links a new path to a lower file.
    let base = r#"{"compression":"gzip","entries":[
            {"name":"app","type":"dir"},{"name":"app/lib","type":"dir"},
            {"name":"app/lib/a.py","data":"a"},{"name":"app/lib/h.py","data":"h"},
            {"name":"app/lib/h-link.py","type":"hardlink","target":"app/lib/h.py"},
            {"name":"app/lib/h2.py","type":"hardlink","target":"app/lib/h.py"}]},
          {"compression":"gzip","entries":[
            {"name":"app/p.py","data":"p"},
            {"name":"app/p-link.py","type":"hardlink","target":"app/p.py"}]}"#;
    let tops = [
        ("2", r#"{"name":"app/lib/h.py","data":"h rewritten"}"#),
        ("3", r#"{"name":"app/p-link.py","data":"p-link rewritten"}"#),
        (
            "4",
            r#"{"name":"app/lib/h2.py","data":"h2 rewritten"},{"name":"app/again.py","type":"hardlink","target":"app/lib/a.py"}"#,
        ),
    ];
    let mut images = vec![format!(
        r#"{{"tag":"1","platforms":[{{"os":"linux","arch":"amd64","layers":[{base}]}}]}}"#
    )];
    for (tag, top) in tops {
        images.push(format!(
            r#"{{"tag":"{tag}","platforms":[{{"os":"linux","arch":"amd64","layers":[{base},{{"compression":"gzip","entries":[{top}]}}]}}]}}"#
        ));
    }
    let images = format!("[{}]", images.join(","));
    let mut manifests = std::collections::BTreeMap::new();
    for tag in ["1", "2", "3", "4"] {
        manifests.insert(
            tag,
            crate::source_oci::write_layout(&layout, &images, tag)[0].clone(),
        );
    }
    let lower = layer_digests(&layout, &manifests["1"]);
    assert_eq!(lower.len(), 2);
    // What each image is, from a layout that keeps every blob.
    let whole = f.path("whole");
    copy_layout(&layout, &whole);
    let expected = |tag: &str| {
        let dest = format!("vol/fresh-{tag}");
        let src = format!("oci-layout:{}:{tag}", whole.display());
        f.packsync(&["sync", "--grace", "0", &src, &dest]).ok();
        let p = f.path(&dest);
        (tree(&p), links(&p))
    };
    let want: Vec<_> = ["2", "3", "4"].iter().map(|t| expected(t)).collect();
    // The merged trees as overlayfs shows them: the rewritten path apart,
    // the rest of its group still one inode.
    assert_eq!(
        want[0].1,
        [
            r#"hardlinks ["app/lib/h-link.py", "app/lib/h2.py"]"#,
            r#"hardlinks ["app/p-link.py", "app/p.py"]"#
        ]
    );
    assert!(want[0].0.contains(&"app/lib/h.py=h rewritten".to_string()));
    assert_eq!(
        want[1].1,
        [r#"hardlinks ["app/lib/h-link.py", "app/lib/h.py", "app/lib/h2.py"]"#]
    );
    assert_eq!(
        want[2].1,
        [
            r#"hardlinks ["app/again.py", "app/lib/a.py"]"#,
            r#"hardlinks ["app/lib/h-link.py", "app/lib/h.py"]"#,
            r#"hardlinks ["app/p-link.py", "app/p.py"]"#
        ]
    );

    // Each update onto a live generation of tag 1 from a layout without
    // the lower layers' blobs: only the new top layer can be read.
    for (i, tag) in ["2", "3", "4"].iter().enumerate() {
        let dest = format!("vol/up-{tag}");
        let bare = f.path("bare");
        let _ = fs::remove_dir_all(&bare);
        copy_layout(&whole, &bare);
        let src1 = format!("oci-layout:{}:1", bare.display());
        f.packsync(&["sync", "--grace", "0", &src1, &dest]).ok();
        // Tag 4 links a new path to a lower layer's file: that file is
        // read from the live generation (its hash checked), not fetched.
        for l in &lower {
            let hex = l.strip_prefix("sha256:").unwrap();
            fs::remove_file(bare.join("blobs/sha256").join(hex)).unwrap();
        }
        let src = format!("oci-layout:{}:{tag}", bare.display());
        let run = f
            .packsync(&["sync", "--grace", "0", "--json", &src, &dest])
            .ok();
        let v = json(&run);
        assert_eq!(v["status"], "synced", "{v}");
        assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
        let p = f.path(&dest);
        assert_eq!((tree(&p), links(&p)), want[i], "tag {tag}");
        // The generation a fresh sync of the image makes, byte for byte.
        assert_eq!(
            fs::read_link(&p).unwrap().file_name(),
            fs::read_link(f.path(&format!("vol/fresh-{tag}")))
                .unwrap()
                .file_name(),
            "tag {tag}"
        );
    }

    // The lower file tag 4 links to, edited in the live tree in place
    // (same size, same mtime: the plan's quick check cannot see it): its
    // hash differs from the manifest's, so every layer is fetched and the
    // new generation holds the image's bytes.
    let src1 = format!("oci-layout:{}:1", whole.display());
    f.packsync(&["sync", "--grace", "0", &src1, "vol/drift"])
        .ok();
    let a = fs::canonicalize(f.path("vol/drift"))
        .unwrap()
        .join("app/lib/a.py");
    let m = fs::metadata(&a).unwrap();
    fs::write(&a, "A").unwrap();
    crate::fixture::set_mtime(&a, m.mtime(), m.mtime_nsec() as u32);
    let src4 = format!("oci-layout:{}:4", whole.display());
    f.packsync(&["sync", "--grace", "0", &src4, "vol/drift"])
        .ok();
    assert_eq!(
        (tree(&f.path("vol/drift")), links(&f.path("vol/drift"))),
        want[2]
    );
}

/// An uncompressed ustar archive of `members` (a name ending in `/` is a
/// directory), as `skopeo copy … oci-archive:` and `podman save` write
/// them: the outer tar of an image archive.
fn outer_tar(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let mut h = [0u8; 512];
        assert!(name.len() < 100, "{name}");
        h[..name.len()].copy_from_slice(name.as_bytes());
        let dir = name.ends_with('/');
        let octal = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = len - 1);
            h[at..at + len].copy_from_slice(s.as_bytes());
        };
        octal(&mut h, 100, 8, if dir { 0o755 } else { 0o644 });
        octal(&mut h, 108, 8, 0);
        octal(&mut h, 116, 8, 0);
        octal(&mut h, 124, 12, if dir { 0 } else { data.len() as u64 });
        octal(&mut h, 136, 12, 1_700_000_000);
        h[156] = if dir { b'5' } else { b'0' };
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        if !dir {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The files of the layout `dir` as members of an oci-archive.
fn oci_archive_of(dir: &std::path::Path) -> Vec<u8> {
    let mut members = vec![
        (
            "oci-layout".to_string(),
            fs::read(dir.join("oci-layout")).unwrap(),
        ),
        ("blobs/".to_string(), Vec::new()),
        ("blobs/sha256/".to_string(), Vec::new()),
    ];
    let mut blobs: Vec<_> = fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    blobs.sort();
    for b in blobs {
        let name = format!("blobs/sha256/{}", b.file_name().unwrap().to_string_lossy());
        members.push((name, fs::read(&b).unwrap()));
    }
    // skopeo writes index.json last.
    members.push((
        "index.json".to_string(),
        fs::read(dir.join("index.json")).unwrap(),
    ));
    outer_tar(&members)
}

/// Flip one byte of the member `name`'s data inside the tar `bytes`.
fn corrupt_member(bytes: &mut [u8], name: &str) {
    let mut at = 0;
    while at + 512 <= bytes.len() && bytes[at] != 0 {
        let h = &bytes[at..at + 512];
        let n = h.iter().take(100).position(|&b| b == 0).unwrap_or(100);
        let size = u64::from_str_radix(
            std::str::from_utf8(&h[124..135])
                .unwrap()
                .trim_matches('\0'),
            8,
        )
        .unwrap() as usize;
        if &h[..n] == name.as_bytes() {
            bytes[at + 512 + size / 2] ^= 0xff;
            return;
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    panic!("no member {name}");
}

#[test]
fn an_oci_archive_is_an_image_source_and_a_plain_file_gets_a_hint() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    let images = r#"[{"tag":"1.0","platforms":[
        {"os":"linux","arch":"amd64","layers":[
          {"compression":"gzip","entries":[{"name":"opt","type":"dir"},
            {"name":"opt/packs","type":"dir"},{"name":"opt/packs/core.yaml","data":"core"},
            {"name":"opt/packs/gone.yaml","data":"removed by the next layer"},
            {"name":"opt/packs/st2.yaml","data":"st2"},
            {"name":"opt/packs/st2-link.yaml","type":"hardlink","target":"opt/packs/st2.yaml"}]},
          {"compression":"none","entries":[{"name":"opt/packs/.wh.gone.yaml"},
            {"name":"etc","type":"dir"},{"name":"etc/motd","data":"hello"}]}]},
        {"os":"linux","arch":"arm64","layers":[
          {"compression":"gzip","entries":[{"name":"arm","data":"arm"}]}]}]}]"#;
    let platforms = crate::source_oci::write_layout(&layout, images, "1.0");
    fs::write(f.path("img.tar"), oci_archive_of(&layout)).unwrap();
    // What the same image gives from the layout directory.
    let lay = format!("oci-layout:{}:1.0", layout.display());
    let amd64 = ["--platform", "linux/amd64"];
    let run = |src: &str, dest: &str| {
        let mut args = vec!["sync", "--grace", "0"];
        args.extend(amd64);
        args.extend([src, dest]);
        f.packsync(&args)
    };
    run(&lay, "vol/from-layout").ok();
    let want = tree(&f.path("vol/from-layout"));
    assert!(
        want.contains(&"opt/packs/st2-link.yaml=st2".to_string()),
        "{want:?}"
    );

    run("oci-archive:img.tar:1.0", "vol/packs").ok();
    assert_eq!(tree(&f.dest()), want);
    assert_eq!(links(&f.dest()), links(&f.path("vol/from-layout")));
    let status = f.packsync(&["status", "vol/packs"]).ok();
    let archive = fs::canonicalize(f.path("img.tar")).unwrap();
    let id = format!("oci-archive:{}@{}", archive.display(), platforms[0]);
    assert!(status.stdout.contains(&id), "{}", status.stdout);
    // Without a tag: the only image; the same again is up to date and
    // writes nothing.
    let again = f.unchanged_by(|| run("oci-archive:img.tar", "vol/packs").ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    // //PATH and --platform as for any image.
    run("oci-archive:img.tar:1.0//opt/packs", "vol/sub").ok();
    assert_eq!(
        tree(&f.path("vol/sub")),
        ["core.yaml=core", "st2-link.yaml=st2", "st2.yaml=st2"]
    );
    f.packsync(&[
        "sync",
        "--platform",
        "linux/arm64",
        "oci-archive:img.tar",
        "vol/arm",
    ])
    .ok();
    assert_eq!(tree(&f.path("vol/arm")), ["arm=arm"]);

    // Refusals: a tag the archive lacks, a layer that is not what its
    // digest says (exit 1, nothing changed), a file that is no tar.
    f.refused(
        &["sync", "oci-archive:img.tar:2.0", "vol/packs"],
        1,
        "no tag 2.0 in the layout (it has 1.0)",
    );
    let layer = layer_digests(&layout, &platforms[0])[0].clone();
    let mut bad = fs::read(f.path("img.tar")).unwrap();
    corrupt_member(&mut bad, &format!("blobs/sha256/{}", &layer[7..]));
    fs::write(f.path("bad.tar"), bad).unwrap();
    let mut args = vec!["sync", "--grace", "0"];
    args.extend(amd64);
    args.extend(["oci-archive:bad.tar:1.0", "vol/packs"]);
    f.unchanged_but_staging(|| f.packsync(&args).fails(1, "digest mismatch"));
    fs::write(f.path("notar"), "plain words").unwrap();
    f.refused(
        &["sync", "oci-archive:notar", "vol/packs"],
        2,
        "oci-archive:notar: not an image archive",
    );
    f.refused(
        &["sync", "oci-archive:missing.tar", "vol/packs"],
        2,
        "missing.tar: no such file",
    );

    // The archive as a plain FILE SOURCE: exit 2 with the form to use,
    // nothing unpacked.
    f.refused(
        &["sync", "img.tar", "vol/packs"],
        2,
        "img.tar is an OCI image archive: use oci-archive:img.tar",
    );
}

/// A `podman save` docker-archive of one image: `manifest.json`, the
/// config as `HEX.json`, each layer an uncompressed tar named `HEX.tar`
/// (its diff_id), or, with `legacy`, `ID/layer.tar` as Docker wrote it.
fn docker_archive(layers: &[Vec<u8>], tags: &[&str], legacy: bool) -> (Vec<u8>, String) {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(l)))
        .collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let config_hex = sha256_hex(&config);
    let mut members = Vec::new();
    let mut names = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let name = if legacy {
            let id = format!("{i:064x}");
            members.push((format!("{id}/"), Vec::new()));
            members.push((format!("{id}/VERSION"), b"1.0".to_vec()));
            format!("{id}/layer.tar")
        } else {
            format!("{}.tar", sha256_hex(l))
        };
        members.push((name.clone(), l.clone()));
        names.push(name);
    }
    members.push((format!("{config_hex}.json"), config));
    let manifest = serde_json::json!([{
        "Config": format!("{config_hex}.json"), "RepoTags": tags, "Layers": names,
    }]);
    members.push((
        "manifest.json".into(),
        serde_json::to_vec(&manifest).unwrap(),
    ));
    (outer_tar(&members), format!("sha256:{config_hex}"))
}

#[test]
fn a_docker_archive_is_an_image_source_checked_against_its_diff_ids() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let lower = tar_of(
        r#"[{"name":"app","type":"dir"},{"name":"app/a.py","data":"a"},
            {"name":"app/gone.py","data":"gone"},
            {"name":"app/b.py","data":"b"},{"name":"app/b-link.py","type":"hardlink","target":"app/b.py"}]"#,
        false,
    );
    let upper = tar_of(
        r#"[{"name":"app/.wh.gone.py"},{"name":"app/c.py","data":"c"}]"#,
        false,
    );
    let want = [
        "app/",
        "app/a.py=a",
        "app/b-link.py=b",
        "app/b.py=b",
        "app/c.py=c",
    ];
    for legacy in [false, true] {
        let (bytes, id) = docker_archive(
            &[lower.clone(), upper.clone()],
            &["localhost/app:1.0"],
            legacy,
        );
        fs::write(f.path("saved.tar"), &bytes).unwrap();
        let dest = format!("vol/legacy-{legacy}");
        f.packsync(&["sync", "--grace", "0", "docker-archive:saved.tar", &dest])
            .ok();
        assert_eq!(tree(&f.path(&dest)), want, "legacy {legacy}");
        assert_eq!(
            links(&f.path(&dest)),
            [r#"hardlinks ["app/b-link.py", "app/b.py"]"#]
        );
        // Named by the image ID (its config's digest).
        let status = f.packsync(&["status", &dest]).ok();
        let file = fs::canonicalize(f.path("saved.tar")).unwrap();
        assert!(
            status
                .stdout
                .contains(&format!("docker-archive:{}@{id}", file.display())),
            "{}",
            status.stdout
        );
    }
    // By its tag (as podman writes it, or as the user types it), or by index.
    for src in [
        "docker-archive:saved.tar:app:1.0",
        "docker-archive:saved.tar:localhost/app:1.0",
        "docker-archive:saved.tar:@0",
    ] {
        f.packsync(&["sync", "--grace", "0", src, "vol/packs"]).ok();
        assert_eq!(tree(&f.path("vol/packs")), want, "{src}");
    }
    f.refused(
        &["sync", "docker-archive:saved.tar:app:2.0", "vol/packs"],
        1,
        "no image app:2.0 in the archive (it has localhost/app:1.0)",
    );
    // A layer that is not what the config's diff_ids say: exit 1.
    let (bytes, _) = docker_archive(&[lower.clone(), upper.clone()], &["app:1.0"], true);
    let mut bad = bytes.clone();
    let needle = upper.clone();
    let start = bad
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap();
    bad[start + 512] ^= 1; // the first data block of the layer: "c"
    fs::write(f.path("bad.tar"), bad).unwrap();
    f.unchanged_but_staging(|| {
        f.packsync(&[
            "sync",
            "--grace",
            "0",
            "docker-archive:bad.tar",
            "vol/packs",
        ])
        .fails(1, "digest mismatch")
    });
    // As a plain FILE SOURCE: the hint.
    f.refused(
        &["sync", "saved.tar", "vol/packs"],
        2,
        "saved.tar is a Docker image archive (docker save): use docker-archive:saved.tar",
    );
}
