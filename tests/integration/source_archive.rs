//! Archive sources: a FILE holding a tar, tar.gz or tar.zst (OPA bundles,
//! release tarballs), told by content, spooled and published like a
//! directory; hostile archives refused with the volume unchanged.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::fixture::{json, links, snapshot, Fixture, Run};

/// One entry of an archive the test builds.
#[derive(Clone)]
struct E {
    name: &'static str,
    kind: char,
    data: String,
    mode: u32,
    mtime: f64,
}

fn file(name: &'static str, data: &str) -> E {
    E {
        name,
        kind: 'f',
        data: data.into(),
        mode: 0o644,
        mtime: 1_700_000_000.0,
    }
}

fn dir(name: &'static str) -> E {
    E {
        name,
        kind: 'd',
        data: String::new(),
        mode: 0o755,
        mtime: 1_700_000_000.0,
    }
}

fn link(name: &'static str, kind: char, target: &str) -> E {
    E {
        name,
        kind,
        data: target.into(),
        mode: 0o777,
        mtime: 1_700_000_000.0,
    }
}

/// A PAX tar of `entries`, written by Python's tarfile (the names as
/// given: a leading `/` stays, as `opa build` writes it).
fn tar(entries: &[E]) -> Vec<u8> {
    let spec: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "name": e.name, "kind": e.kind.to_string(), "data": e.data,
                "mode": e.mode, "mtime": e.mtime,
            })
        })
        .collect();
    let script = r#"
import io, json, sys, tarfile
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
    for e in json.load(sys.stdin):
        i = tarfile.TarInfo(e["name"])
        i.mtime = e["mtime"] if e["mtime"] != int(e["mtime"]) else int(e["mtime"])
        i.mode = e["mode"]
        i.uid, i.gid = 1000, 1000
        k, data = e["kind"], e["data"].encode()
        if k == "d":
            i.type = tarfile.DIRTYPE
            t.addfile(i)
        elif k in "lh":
            i.type = tarfile.SYMTYPE if k == "l" else tarfile.LNKTYPE
            i.linkname = e["data"]
            t.addfile(i)
        else:
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
sys.stdout.buffer.write(out.getvalue())
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&spec).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 tarfile failed");
    out.stdout
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An OPA bundle: `.manifest` with revision and roots, data, policies.
fn bundle(revision: &str, data: &str) -> Vec<E> {
    vec![
        file(
            "/.manifest",
            &format!(r#"{{"revision":"{revision}","roots":["authz"]}}"#),
        ),
        file("/data.json", data),
        dir("authz"),
        file("authz/x.rego", "package authz\ndefault allow := false\n"),
        file("authz/y.rego", "package authz\nallow if input.admin\n"),
        link("authz/same.rego", 'h', "authz/y.rego"),
        link("current", 'l', "authz"),
    ]
}

impl Fixture {
    /// Write `bytes` as `name` in the fixture's directory.
    fn archive(&self, name: &str, bytes: &[u8]) -> String {
        fs::write(self.path(name), bytes).unwrap();
        name.to_string()
    }

    fn sync_from(&self, sources: &[&str], extra: &[&str]) -> Run {
        let mut args = vec!["sync", "--grace", "0"];
        args.extend_from_slice(extra);
        args.extend_from_slice(sources);
        args.push("vol/packs");
        self.packsync(&args)
    }
}

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

#[test]
fn an_opa_bundle_lands_from_tar_gz_and_tar_zst() {
    let f = Fixture::new();
    let raw = tar(&bundle("1", r#"{"users":["a"]}"#));
    let gz = f.archive("bundle.tar.gz", &gzip(&raw));
    let zst = f.archive("bundle.tar.zst", &zstd(&raw));
    // The same tree unpacked by GNU tar is what DEST must show.
    fs::write(f.path("plain.tar"), &raw).unwrap();
    let ok = std::process::Command::new("tar")
        .args(["-xf", "plain.tar", "-C", "src"])
        .current_dir(f.dir.path())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let want = snapshot(&f.src(), false);
    f.sync_from(&[&gz], &[]).ok();
    assert_eq!(snapshot(&f.dest(), false), want);
    assert_eq!(
        links(&f.dest()),
        links(&f.src()),
        "hardlinks stay hardlinks"
    );
    assert_eq!(links(&f.dest()).len(), 1);
    assert_eq!(
        fs::read_to_string(f.dest().join("data.json")).unwrap(),
        r#"{"users":["a"]}"#
    );
    // status names the archive and the SHA-256 of its bytes.
    let digest = sha256(&fs::read(f.path(&gz)).unwrap());
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(
        status
            .stdout
            .contains(&format!("bundle.tar.gz@sha256:{digest}")),
        "{}",
        status.stdout
    );
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    assert!(
        json.stdout.contains(&format!("@sha256:{digest}")),
        "{}",
        json.stdout
    );

    let zf = Fixture::new();
    let zst2 = zf.archive("bundle.tar.zst", &fs::read(f.path(&zst)).unwrap());
    zf.sync_from(&[&zst2], &[]).ok();
    assert_eq!(snapshot(&zf.dest(), false), want);
    // Named by content, not by suffix: a plain tar called .tgz is read as tar.
    let pf = Fixture::new();
    let odd = pf.archive("odd.tgz", &raw);
    pf.sync_from(&[&odd], &[]).ok();
    assert_eq!(snapshot(&pf.dest(), false), want);
}

#[test]
fn a_changed_bundle_updates_and_unchanged_files_are_hardlinked() {
    let f = Fixture::new();
    let one = gzip(&tar(&bundle("1", r#"{"users":["a"]}"#)));
    let a = f.archive("b.tar.gz", &one);
    f.sync_from(&[&a], &[]).ok();
    let y_before = ino(&f.dest().join("authz/y.rego"));
    // Again, unchanged: nothing to do.
    let again = f.sync_from(&[&a], &[]).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);

    // data.json: same size, same mtime, other content; x.rego dropped; z.rego new.
    let mut two = bundle("2", r#"{"users":["b"]}"#);
    two.retain(|e| e.name != "authz/x.rego");
    two.push(file("authz/z.rego", "package authz\n"));
    let b = f.archive("b.tar.gz", &gzip(&tar(&two)));
    let run = f.sync_from(&[&b], &[]).ok();
    assert!(run.stdout.contains("synced"), "{}", run.stdout);
    assert_eq!(
        fs::read_to_string(f.dest().join("data.json")).unwrap(),
        r#"{"users":["b"]}"#,
        "a same-size same-mtime edit is picked up"
    );
    assert!(!f.dest().join("authz/x.rego").exists());
    assert!(f.dest().join("authz/z.rego").exists());
    assert_eq!(
        ino(&f.dest().join("authz/y.rego")),
        y_before,
        "an unchanged file is hardlinked from the previous generation"
    );
    assert!(fs::read_to_string(f.dest().join(".manifest"))
        .unwrap()
        .contains("\"2\""));
}

/// An archive made again (other bytes: here plain tar, then zstd) with the
/// same tree is up to date, compared by content with the live manifest,
/// and publishes nothing; one whose only change is a file of the same size
/// and mtime with other bytes is synced, that file copied anew and every
/// other hardlinked from the live generation.
#[test]
fn an_archive_made_again_is_up_to_date_by_content_and_a_same_size_edit_alone_is_not() {
    let f = Fixture::new();
    let entries = bundle("1", r#"{"users":["a"]}"#);
    let a = f.archive("b.tar", &tar(&entries));
    let first = json(&f.sync_from(&[&a], &["--json"]).ok());
    assert_eq!(first["status"], "synced", "{first}");
    let y = ino(&f.dest().join("authz/y.rego"));
    let gens = || fs::read_dir(f.state().join("gen")).unwrap().count();

    let again = f.archive("b.tar", &zstd(&tar(&entries)));
    let v = json(&f.sync_from(&[&again], &["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
    assert_eq!(v["generation"], first["generation"], "{v}");
    assert_eq!(gens(), 1);

    let edited = bundle("1", r#"{"users":["b"]}"#);
    let b = f.archive("b.tar", &tar(&edited));
    let v = json(&f.sync_from(&[&b], &["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(
        (v["changed"].as_u64(), v["copied"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("data.json")).unwrap(),
        r#"{"users":["b"]}"#
    );
    assert_eq!(
        ino(&f.dest().join("authz/y.rego")),
        y,
        "hardlinked, not copied"
    );
}

#[test]
fn pax_times_keep_their_fraction() {
    let f = Fixture::new();
    let mut e = file("t", "x");
    e.mtime = 1_700_000_000.5;
    let a = f.archive("t.tar", &tar(&[e]));
    f.sync_from(&[&a], &[]).ok();
    assert_eq!(
        crate::fixture::mtime(&f.dest().join("t")),
        (1_700_000_000, 500_000_000)
    );
}

#[test]
fn a_subtree_is_taken_with_a_double_slash() {
    let f = Fixture::new();
    let a = f.archive("b.tar.gz", &gzip(&tar(&bundle("1", "{}"))));
    f.sync_from(&["b.tar.gz//authz"], &[]).ok();
    let mut names: Vec<String> = fs::read_dir(f.dest())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["same.rego", "x.rego", "y.rego"]);
    assert_eq!(
        ino(&f.dest().join("same.rego")),
        ino(&f.dest().join("y.rego"))
    );
    // A PATH the archive lacks is only known once it is read: exit 1.
    f.unchanged_but_staging(|| {
        f.sync_from(&[&format!("{a}//nope")], &[])
            .fails(1, "b.tar.gz//nope: //nope is not in the source")
    });
}

#[test]
fn archives_and_directories_overlay_in_order() {
    let f = Fixture::new();
    f.file("shared", "from the directory");
    f.file("only-dir", "d");
    let a = f.archive(
        "a.tar",
        &tar(&[
            file("shared", "from the archive"),
            file("only-archive", "a"),
        ]),
    );
    f.sync_from(&["src", &a], &[]).ok();
    assert_eq!(
        fs::read_to_string(f.dest().join("shared")).unwrap(),
        "from the archive"
    );
    assert!(f.dest().join("only-dir").exists() && f.dest().join("only-archive").exists());
    f.sync_from(&[&a, "src"], &[]).ok();
    assert_eq!(
        fs::read_to_string(f.dest().join("shared")).unwrap(),
        "from the directory"
    );
    assert!(f.dest().join("only-dir").exists() && f.dest().join("only-archive").exists());
}

/// A ustar header block built by hand (for archives no tool would write).
fn header(name: &[u8], flag: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..107].copy_from_slice(b"0000644");
    b[108..115].copy_from_slice(b"0000000");
    b[116..123].copy_from_slice(b"0000000");
    let sz = format!("{size:011o}");
    b[124..135].copy_from_slice(sz.as_bytes());
    b[136..147].copy_from_slice(b"14000000000");
    b[156] = flag;
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    seal(&mut b);
    b
}

fn seal(b: &mut [u8; 512]) {
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b.iter().map(|&x| x as u32).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// One PAX record, `LEN KEY=VALUE\n`.
fn pax_record(k: &str, v: &str) -> Vec<u8> {
    let base = k.len() + v.len() + 3;
    let mut len = base + 1;
    while len != base + len.to_string().len() {
        len = base + len.to_string().len();
    }
    format!("{len} {k}={v}\n").into_bytes()
}

fn raw_tar(entries: &[([u8; 512], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (h, data) in entries {
        out.extend_from_slice(h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

#[test]
fn hostile_archives_are_refused_and_change_nothing() {
    let f = Fixture::new();
    let good = f.archive("good.tar", &tar(&bundle("1", "{}")));
    f.sync_from(&[&good], &[]).ok();
    fs::create_dir(f.path("outside")).unwrap();
    let outside = f.path("outside");
    let out_link = outside.to_str().unwrap().as_bytes().to_vec();

    let ok_entry = (header(b"fine", b'0', 4, b""), &b"fine"[..]);
    let data = raw_tar(&[(header(b"big", b'0', 2000, b""), &[7u8; 2000])]);
    let mut huge = header(b"huge", b'0', 0, b"");
    huge[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    seal(&mut huge);
    let mut bad_sum = header(b"f", b'0', 0, b"");
    bad_sum[0] = b'g';
    let mut corrupt_gz = gzip(&tar(&bundle("1", &"x".repeat(5000))));
    let n = corrupt_gz.len();
    corrupt_gz[n / 2] ^= 0x55;
    corrupt_gz[n - 7] ^= 0xff;

    let mut trailing = gzip(&tar(&bundle("1", "{}")));
    let members = trailing.len();
    trailing.extend_from_slice(b"garbage after the stream\n");
    let global_path = pax_record("path", "everything");
    let pax_size = pax_record("size", "1024");
    let bad_mtime = pax_record("mtime", "1350244992.023960108467a");

    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "sized-pax-symlink.tar",
            raw_tar(&[
                (header(b"x", b'x', pax_size.len() as u64, b""), &pax_size),
                (header(b"s", b'2', 0, b"fine"), b""),
                (header(b"d/secret", b'0', 6, b""), b"SECRET"),
            ]),
            "the symlink entry at byte 1024 claims 1024 bytes of data (refused".into(),
        ),
        (
            "trailing.tar.gz",
            trailing,
            format!("data after the last gzip member at byte {members}"),
        ),
        (
            "global-path.tar",
            raw_tar(&[
                (
                    header(b"g", b'g', global_path.len() as u64, b""),
                    &global_path,
                ),
                ok_entry,
            ]),
            "the PAX global header at byte 0 sets path".into(),
        ),
        (
            "bad-pax.tar",
            raw_tar(&[
                (header(b"x", b'x', bad_mtime.len() as u64, b""), &bad_mtime),
                ok_entry,
            ]),
            "bad PAX header at byte 0: mtime=1350244992.023960108467a".into(),
        ),
        (
            "hardempty.tar",
            raw_tar(&[ok_entry, (header(b"h", b'1', 0, b""), b"")]),
            "hardlink 'h' to '' refused".into(),
        ),
        (
            "dotdot.tar",
            raw_tar(&[ok_entry, (header(b"../x", b'0', 1, b""), b"x")]),
            "\"..\" component".into(),
        ),
        (
            "deep.tar",
            raw_tar(&[(header(b"a/../../x", b'0', 1, b""), b"x")]),
            "\"..\" component".into(),
        ),
        (
            "through.tar",
            raw_tar(&[
                (header(b"l", b'2', 0, &out_link), b""),
                (header(b"l/passwd", b'0', 1, b""), b"x"),
            ]),
            "reached through the symlink l".into(),
        ),
        (
            "hardout.tar",
            raw_tar(&[(header(b"h", b'1', 0, b"../../etc/x"), b"")]),
            "its target leaves the tree".into(),
        ),
        (
            "hardnone.tar",
            raw_tar(&[ok_entry, (header(b"h", b'1', 0, b"missing"), b"")]),
            "not an earlier file of the archive".into(),
        ),
        (
            "cut-header.tar",
            data[..300].to_vec(),
            "truncated inside the header".into(),
        ),
        (
            "cut-data.tar",
            data[..1000].to_vec(),
            "truncated inside an entry's data".into(),
        ),
        (
            "cut-end.tar",
            data[..2560].to_vec(),
            "without its end-of-archive block".into(),
        ),
        ("corrupt.tar.gz", corrupt_gz, "corrupt".into()),
        (
            "huge.tar",
            raw_tar(&[(huge, b"")]),
            "claims 1152921504606846976 bytes".into(),
        ),
        (
            "checksum.tar",
            raw_tar(&[ok_entry, (bad_sum, b"")]),
            "bad header checksum".into(),
        ),
    ];
    for (name, bytes, needle) in cases {
        let a = f.archive(name, &bytes);
        let run = f.unchanged_but_staging(|| f.sync_from(&[&a], &[]));
        let first = run.stderr.lines().next().unwrap_or_default().to_string();
        assert!(
            first.contains(name),
            "{name}: the line names the archive: {}",
            run.stderr
        );
        run.fails(1, &needle);
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            0,
            "{name}: nothing written outside"
        );
        assert!(!f.path("x").exists() && !f.path("vol/x").exists(), "{name}");
    }
    assert_eq!(
        fs::read_to_string(f.dest().join(".manifest")).unwrap(),
        r#"{"revision":"1","roots":["authz"]}"#
    );
}

#[test]
fn a_refused_first_sync_leaves_no_state_directory_nor_dest() {
    let f = Fixture::new();
    let a = f.archive(
        "dotdot.tar",
        &raw_tar(&[(header(b"../x", b'0', 1, b""), b"x")]),
    );
    f.sync_from(&[&a], &[])
        .fails(1, "dotdot.tar: entry ../x has a \"..\" component");
    assert_eq!(fs::read_dir(f.path("vol")).unwrap().count(), 0);
    // Nor the directories it would have made for DEST: a fanout DEST, and
    // DEST's parents with --mkpath.
    for (args, dest) in [
        (&["--layout", "fanout"][..], "vol/fan"),
        (&["--mkpath"][..], "vol/a/b/packs"),
        (&["--layout", "fanout", "--mkpath"][..], "vol/c/fan"),
    ] {
        let mut cmd = vec!["sync"];
        cmd.extend_from_slice(args);
        cmd.extend_from_slice(&["dotdot.tar", dest]);
        let out = f.packsync(&cmd);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        let left: Vec<_> = fs::read_dir(f.path("vol")).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

#[test]
fn what_is_no_archive_is_a_usage_error() {
    let f = Fixture::new();
    let mut noise = vec![0u8; 4096];
    let mut x: u32 = 12345;
    for b in noise.iter_mut() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 16) as u8;
    }
    let a = f.archive("noise.tar.gz", &noise);
    f.refused(
        &["sync", &a, "vol/packs"],
        2,
        "noise.tar.gz: source is not a directory or a recognisable archive",
    );
    // gzip of something that is not a tar.
    let g = f.archive("text.gz", &gzip(&[b'a'; 2000]));
    f.refused(
        &["sync", &g, "vol/packs"],
        2,
        "not a directory or a recognisable archive",
    );
}

#[test]
fn special_entries_are_skipped_with_a_warning() {
    let f = Fixture::new();
    let a = f.archive(
        "dev.tar",
        &raw_tar(&[
            (header(b"fifo", b'6', 0, b""), b""),
            (header(b"tty", b'3', 0, b""), b""),
            (header(b"f", b'0', 1, b""), b"1"),
        ]),
    );
    let run = f.sync_from(&[&a], &[]).ok();
    assert!(
        run.stderr.contains("skipping FIFO dev.tar/fifo"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("skipping character device dev.tar/tty"),
        "{}",
        run.stderr
    );
    let names: Vec<_> = fs::read_dir(f.dest()).unwrap().collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn sigterm_while_spooling_leaves_no_spool_and_publishes_nothing() {
    let f = Fixture::new();
    let one = f.archive("one.tar", &tar(&bundle("1", "{}")));
    f.sync_from(&[&one], &[]).ok();
    let two = f.archive("two.tar.gz", &gzip(&tar(&bundle("2", "{}"))));
    let resume = f.path("resume");
    let before = f.volume();
    let mut cmd = f.command(&["sync", "--grace", "0", &two, "vol/packs"]);
    let child = crate::faults::start_paused(&mut cmd, "spooling", &resume);
    // Paused with the first entry in the spool, inside this writer's staging.
    let stage = f.state().join("stage");
    let staged: Vec<_> = fs::read_dir(&stage)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(staged.len(), 1);
    assert!(staged[0].join("spool/0/.manifest").exists(), "{staged:?}");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let run = Run::wait(child);
    assert_eq!(run.code, 143, "{}", run.stderr);
    assert_eq!(
        fs::read_dir(&stage).unwrap().count(),
        0,
        "the spool went with the staging"
    );
    let unstaged = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .filter(|l| !l.starts_with("\".packs.packsync/stage\" d"))
            .collect()
    };
    assert_eq!(unstaged(f.volume()), unstaged(before));
}

#[test]
fn a_dry_run_reads_the_archive_and_writes_nothing_on_the_volume() {
    let f = Fixture::new();
    let one = f.archive("one.tar.gz", &gzip(&tar(&bundle("1", r#"{"a":1}"#))));
    // On a fresh volume, then beside a live generation: nothing changes,
    // not even an mtime.
    let first = f.unchanged_by(|| f.sync_from(&[&one], &["--dry-run", "--itemize"]).ok());
    assert!(first.stdout.contains("+ data.json"), "{}", first.stdout);
    f.sync_from(&[&one], &[]).ok();
    let two = f.archive("two.tar.gz", &gzip(&tar(&bundle("1", r#"{"a":2}"#))));
    let run = f.unchanged_by(|| f.sync_from(&[&two], &["--dry-run", "--itemize"]).ok());
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with('~'))
            .collect::<Vec<_>>(),
        ["~ data.json"],
        "{}",
        run.stdout
    );
}

/// What GNU tar, bsdtar and tarfile all read from archives that packsync
/// once read otherwise: a directory header's size field carries no data, a
/// Solaris `X` header is a PAX header, a PAX global header's mtime applies
/// to every later entry, an entry of an unknown type is a file, a zstd
/// stream may start with a skippable frame.
#[test]
fn what_every_reference_reader_sees_is_published() {
    let f = Fixture::new();
    let renamed = [
        pax_record("path", "renamed"),
        pax_record("mtime", "1234567890.5"),
    ]
    .concat();
    let global = [
        pax_record("mtime", "1000000000"),
        pax_record("comment", "0123abc"),
    ]
    .concat();
    let local = pax_record("mtime", "1500000000");
    let raw = raw_tar(&[
        // A directory that claims 1024 bytes: the next two headers are
        // entries (and so is a sized hardlink's, before any PAX header).
        (header(b"d/", b'5', 1024, b""), b""),
        (header(b"d/secret", b'0', 6, b""), b"SECRET"),
        (header(b"d/lnk", b'1', 255, b"d/secret"), b""),
        (header(b"d/sym", b'2', 512, b"after"), b""),
        (header(b"d/after", b'0', 3, b""), b"aft"),
        (header(b"g", b'g', global.len() as u64, b""), &global),
        (header(b"X/x", b'X', renamed.len() as u64, b""), &renamed),
        (header(b"orig", b'0', 2, b""), b"hi"),
        (header(b"x/two", b'x', local.len() as u64, b""), &local),
        (header(b"two", b'0', 1, b""), b"2"),
        (header(b"odd", b'Z', 4, b""), b"data"),
    ]);
    // What pzstd writes: a skippable frame, then the zstd frame.
    let mut zst = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 0, 0, 0, 0];
    zst.extend(zstd(&raw));
    let a = f.archive("ref.tar.zst", &zst);
    let run = f.sync_from(&[&a], &[]).ok();
    assert!(
        run.stderr
            .contains("odd: tar entry of the unknown type 'Z', read as a regular file"),
        "{}",
        run.stderr
    );
    let d = f.dest();
    let read = |p: &str| fs::read_to_string(d.join(p)).unwrap();
    assert_eq!(
        (read("d/secret"), read("d/lnk"), read("d/after")),
        ("SECRET".into(), "SECRET".into(), "aft".into())
    );
    assert_eq!(ino(&d.join("d/secret")), ino(&d.join("d/lnk")));
    assert_eq!(fs::read_link(d.join("d/sym")).unwrap(), Path::new("after"));
    assert!(!d.join("orig").exists());
    assert_eq!(read("renamed"), "hi");
    assert_eq!(
        crate::fixture::mtime(&d.join("renamed")),
        (1_234_567_890, 500_000_000)
    );
    assert_eq!(crate::fixture::mtime(&d.join("odd")), (1_000_000_000, 0));
    assert_eq!(crate::fixture::mtime(&d.join("two")), (1_500_000_000, 0));
    assert_eq!(read("odd"), "data");
    // The same archive again is up to date.
    let again = f.sync_from(&[&a], &[]).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
}

#[test]
fn an_archive_of_more_entries_than_max_entries_is_refused() {
    let f = Fixture::new();
    let small = f.archive("small.tar.gz", &gzip(&tar(&bundle("1", "{}"))));
    f.sync_from(&[&small], &["--max-entries", "10"]).ok();
    let many: Vec<E> = (0..30)
        .map(|i| file(Box::leak(format!("f{i:02}").into_boxed_str()), "x"))
        .collect();
    let big = f.archive("many.tar.gz", &gzip(&tar(&many)));
    f.unchanged_but_staging(|| f.sync_from(&[&big], &["--max-entries", "20"]))
        .fails(
            1,
            "many.tar.gz: holds more than 20 entries (refused by --max-entries 20",
        );
    f.sync_from(&[&big], &["--max-entries", "30"]).ok();
    assert!(f.dest().join("f29").exists());
}

/// An archive's extended attributes land with its files; one the volume
/// refuses (a `security.capability` that is no capability: EINVAL) is one
/// warning naming it, and the tree still lands with the rest.
#[test]
fn extended_attributes_land_and_a_refused_one_is_one_warning() {
    let f = Fixture::new();
    let caps = [
        pax_record("SCHILY.xattr.security.capability", "caps"),
        pax_record("SCHILY.xattr.user.note", "x"),
    ]
    .concat();
    let a = f.archive(
        "caps.tar",
        &raw_tar(&[
            (header(b"x", b'x', caps.len() as u64, b""), &caps),
            (header(b"bin/ping", b'0', 4, b""), b"ping"),
            (header(b"bin/ls", b'0', 2, b""), b"ls"),
        ]),
    );
    let run = f.sync_from(&[&a], &[]).ok();
    let warned: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("extended attributes"))
        .collect();
    assert_eq!(
        warned,
        ["packsync: warning: the volume refused 1 extended attributes (first: security.capability: Invalid argument (os error 22)); published without them"],
        "{}",
        run.stderr
    );
    let ping = f.dest().join("bin/ping");
    assert_eq!(fs::read_to_string(&ping).unwrap(), "ping");
    assert_eq!(
        crate::xattrs::of(&ping),
        [("user.note".to_string(), b"x".to_vec())]
    );
    assert!(crate::xattrs::of(&f.dest().join("bin/ls")).is_empty());
}

/// `--label auto` takes an archived bundle's revision from its spool; a
/// sync that finds the archive unchanged (nothing spooled) and a dry run
/// still say the label, the live generation's.
#[test]
fn label_auto_says_the_live_revision_when_nothing_is_spooled() {
    let f = Fixture::new();
    let a = f.archive("b.tar.gz", &gzip(&tar(&bundle("v7", "{}"))));
    let label = |extra: &[&str]| {
        let mut args = vec!["--json", "--label", "auto"];
        args.extend_from_slice(extra);
        let v = json(&f.sync_from(&[&a], &args).ok());
        (
            v["status"].as_str().unwrap().to_string(),
            v["label"].clone(),
        )
    };
    assert_eq!(label(&[]), ("synced".into(), "v7".into()));
    assert_eq!(label(&[]), ("up to date".into(), "v7".into()));
    assert_eq!(label(&["--dry-run"]), ("up to date".into(), "v7".into()));
    // Without --label auto the summary names no label of its own.
    let v = json(&f.sync_from(&[&a], &["--json"]).ok());
    assert_eq!(v["label"], serde_json::Value::Null, "{v}");
}
