//! The Kubernetes examples run: every `packsync` command line of every
//! manifest in examples/kubernetes/, against a temporary root that stands in
//! for the images and volumes, exactly as examples/kubernetes/README.md
//! ("How the test runs the manifests") describes. No YAML parser, no cluster.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fixture::bin;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One manifest as the test reads it.
#[derive(Debug, Default)]
struct Example {
    name: String,
    /// `source P D`: the image provides P, filled from repository directory D.
    sources: Vec<(String, String)>,
    /// `image P D`: a publisher's own image has D at P, where the other
    /// containers mount a volume: P as a SOURCE of `packsync sync` reads D.
    images: Vec<(String, String)>,
    /// `volume P`: an empty volume is mounted at P.
    volumes: Vec<String>,
    /// `same A B`: one container mounts at A the volume the others mount at B.
    aliases: Vec<(String, String)>,
    /// `env N=V`
    env: Vec<(String, String)>,
    /// `expect P D`: after the lines ran, the tree through P equals D.
    expects: Vec<(String, String)>,
    /// The packsync command lines, in file order, with their line numbers
    /// (`/usr/local/bin/packsync ...` read as `packsync ...`).
    commands: Vec<(usize, String)>,
    /// Lines that call `packsync` by bare name, relying on the image's PATH.
    bare: Vec<usize>,
    /// `containers`: the manifest reads images from a registry, which no
    /// local replay has; tests/integration/containers.rs plays it instead.
    containers_only: bool,
}

/// Where the manifests call the binary: the path the image puts it at, so
/// an image whose PATH lacks /usr/local/bin (busybox: /bin) still finds it.
const BIN: &str = "/usr/local/bin/packsync";

/// Read the `# packsync-test:` directives and the command lines.
fn parse(name: &str, text: &str) -> Example {
    let mut ex = Example {
        name: name.to_string(),
        ..Default::default()
    };
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("# packsync-test:") {
            let words: Vec<&str> = d.split_whitespace().collect();
            match words.as_slice() {
                ["source", p, d] => ex.sources.push((p.to_string(), d.to_string())),
                ["image", p, d] => ex.images.push((p.to_string(), d.to_string())),
                ["volume", p] => ex.volumes.push(p.to_string()),
                ["same", a, b] => ex.aliases.push((a.to_string(), b.to_string())),
                ["env", kv] => {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("{name}:{}: env needs NAME=value", i + 1));
                    ex.env.push((k.to_string(), v.to_string()));
                }
                ["expect", p, d] => ex.expects.push((p.to_string(), d.to_string())),
                ["containers"] => ex.containers_only = true,
                _ => panic!("{name}:{}: unknown directive {d:?}", i + 1),
            }
            continue;
        }
        let mut c = t;
        if let Some(rest) = c.strip_prefix("- ") {
            c = rest;
        }
        if let Some(rest) = c.strip_prefix("exec ") {
            c = rest;
        }
        if let Some(rest) = c.strip_prefix(BIN).and_then(|r| r.strip_prefix(' ')) {
            ex.commands.push((i + 1, format!("packsync {rest}")));
        } else if c.starts_with("packsync ") {
            ex.commands.push((i + 1, c.to_string()));
            ex.bare.push(i + 1);
        }
    }
    ex
}

/// Where an `image` directive's tree is kept under the root.
const IMAGES: &str = "/.image";

/// `line` as one shared root sees it: each `same` alias becomes the path
/// the other containers use, and an `image` path read as a SOURCE of
/// `packsync sync` (a path before the last one, DEST) becomes that image's
/// own tree.
fn localize(ex: &Example, line: &str) -> String {
    let mut words: Vec<String> = line
        .split(' ')
        .map(|w| {
            for (a, b) in &ex.aliases {
                if w == a
                    || w.strip_prefix(a.as_str())
                        .is_some_and(|r| r.starts_with('/'))
                {
                    return format!("{b}{}", &w[a.len()..]);
                }
            }
            w.to_string()
        })
        .collect();
    if line.starts_with("packsync sync ") {
        if let Some(dest) = words.iter().rposition(|w| w.starts_with('/')) {
            for w in &mut words[..dest] {
                if ex.images.iter().any(|(p, _)| p == w) {
                    *w = format!("{IMAGES}{w}");
                }
            }
        }
    }
    words.join(" ")
}

/// Every word that starts with `/` moves under `root`.
fn rewrite(line: &str, root: &Path) -> String {
    line.split(' ')
        .map(|w| {
            if w.starts_with('/') {
                format!("{}{w}", root.display())
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `cp -a`: symlinks stay symlinks, modes are kept.
pub fn copy_tree(from: &Path, to: &Path) {
    let m = fs::symlink_metadata(from).unwrap();
    if m.file_type().is_symlink() {
        symlink(fs::read_link(from).unwrap(), to).unwrap();
    } else if m.is_dir() {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
        fs::set_permissions(to, fs::Permissions::from_mode(m.mode() & 0o7777)).unwrap();
    } else {
        fs::copy(from, to).unwrap();
        fs::set_permissions(to, fs::Permissions::from_mode(m.mode() & 0o7777)).unwrap();
    }
}

/// Entries, types, bytes, permission bits and symlink targets below `root`
/// (the root itself followed, as a reader opening P would).
pub fn listing(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let perms = m.mode() & 0o7777;
            let what = if m.file_type().is_symlink() {
                format!("symlink -> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                format!("dir {perms:o}")
            } else {
                let data = fs::read(&p).unwrap();
                format!("file {perms:o} {} bytes {:?}", data.len(), digest(&data))
            };
            out.insert(rel, what);
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    let m = fs::metadata(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    out.insert(".".into(), format!("dir {:o}", m.mode() & 0o7777));
    walk(root, root, &mut out);
    out
}

fn digest(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Run one manifest's lines twice under a fresh root; the failures found.
fn run(ex: &Example) -> Vec<String> {
    let mut failures = Vec::new();
    let tmp = tempfile::Builder::new()
        .prefix("packsync-examples")
        .tempdir()
        .unwrap();
    let root = tmp.path();
    assert!(
        root.to_str().is_some_and(|s| s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))),
        "temporary root {} has shell metacharacters",
        root.display()
    );
    let under = |p: &str| root.join(p.trim_start_matches('/'));
    for (p, d) in &ex.sources {
        let to = under(p);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        copy_tree(&repo().join(d), &to);
    }
    for (p, d) in &ex.images {
        let to = under(&format!("{IMAGES}{p}"));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        copy_tree(&repo().join(d), &to);
    }
    for p in &ex.volumes {
        fs::create_dir_all(under(p)).unwrap();
    }
    let commands: Vec<(usize, String)> = ex
        .commands
        .iter()
        .map(|(n, line)| (*n, localize(ex, line)))
        .collect();
    // A typo in a path would otherwise only fail in a real cluster.
    for (n, line) in &commands {
        for w in line.split(' ').filter(|w| w.starts_with('/')) {
            let p = under(w);
            if !p.exists() && !p.parent().is_some_and(Path::exists) {
                failures.push(format!(
                    "{}:{n}: {w}: neither it nor its parent is provided by a source or volume directive",
                    ex.name
                ));
            }
        }
    }
    if !failures.is_empty() {
        return failures;
    }
    let bin_dir = bin().parent().unwrap().to_path_buf();
    let path = match std::env::var_os("PATH") {
        Some(p) => {
            let mut dirs = vec![bin_dir];
            dirs.extend(std::env::split_paths(&p));
            std::env::join_paths(dirs).unwrap()
        }
        None => bin_dir.into_os_string(),
    };
    for round in 1..=2 {
        for (n, line) in &commands {
            let cmd = rewrite(line, root);
            let mut sh = Command::new("sh");
            crate::fixture::clean_env(&mut sh);
            sh.arg("-c")
                .env("PATH", &path)
                .envs(ex.env.iter().map(|(k, v)| (k, v)))
                .current_dir(root);
            let out = if line.contains(" --every ") {
                first_round(sh, &cmd)
            } else {
                sh.arg(&cmd).output().unwrap()
            };
            if !out.status.success() {
                failures.push(format!(
                    "{}:{n} (run {round}): `{line}` exited {:?}: {}",
                    ex.name,
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                return failures;
            }
            if round == 2 && line.starts_with("packsync sync ") {
                let stdout = String::from_utf8_lossy(&out.stdout);
                if !stdout.contains("up to date") {
                    failures.push(format!(
                        "{}:{n}: a repeated sync was not up to date: {}",
                        ex.name,
                        stdout.trim()
                    ));
                }
            }
        }
        for (p, d) in &ex.expects {
            let got = listing(&under(p));
            let want = listing(&repo().join(d));
            if got != want {
                let diff: Vec<String> = want
                    .iter()
                    .filter(|(k, v)| got.get(*k) != Some(*v))
                    .map(|(k, v)| format!("want {k}: {v}, got {:?}", got.get(k)))
                    .chain(
                        got.keys()
                            .filter(|k| !want.contains_key(*k))
                            .map(|k| format!("extra {k}")),
                    )
                    .take(5)
                    .collect();
                failures.push(format!(
                    "{} (run {round}): expect {p} {d}: {}",
                    ex.name,
                    diff.join("; ")
                ));
            }
        }
    }
    failures
}

/// A `sync --every` line: run it until its first round is shown (the
/// first line on stdout), then stop it with SIGTERM as the kubelet would.
/// Its HTTP server listens on a port of the kernel's choosing. Exit 143 is
/// a success here; the output is the first round's.
fn first_round(mut sh: Command, cmd: &str) -> std::process::Output {
    use std::io::BufRead;
    let words: Vec<&str> = cmd.split(' ').collect();
    let cmd: Vec<&str> = words
        .iter()
        .enumerate()
        .map(|(i, w)| match i.checked_sub(1).map(|p| words[p]) {
            Some("--http-bind") => "127.0.0.1:0",
            _ => w,
        })
        .collect();
    // exec: the signal goes to packsync, not to the shell.
    let mut child = sh
        .arg(format!("exec {}", cmd.join(" ")))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // Returns at the first line, or at EOF if packsync exited first.
    out.read_line(&mut first).unwrap();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let mut output = child.wait_with_output().unwrap();
    output.stdout = first.into_bytes();
    if crate::fixture::code(&output) == 143 {
        use std::os::unix::process::ExitStatusExt;
        output.status = std::process::ExitStatus::from_raw(0);
    }
    output
}

fn manifests() -> Vec<Example> {
    let dir = repo().join("examples/kubernetes");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            parse(&name, &fs::read_to_string(p).unwrap())
        })
        .collect()
}

#[test]
fn every_kubernetes_example_runs_twice_and_leaves_the_expected_trees() {
    let all = manifests();
    assert!(all.len() >= 4, "expected the four example manifests");
    let mut failures = Vec::new();
    for ex in &all {
        if ex.containers_only {
            let played =
                fs::read_to_string(repo().join("tests/integration/containers.rs")).unwrap();
            if !played.contains(&format!("examples/kubernetes/{}", ex.name)) {
                failures.push(format!(
                    "{}: `containers`, but tests/integration/containers.rs does not play it",
                    ex.name
                ));
            }
            continue;
        }
        if ex.commands.is_empty() {
            failures.push(format!("{}: no packsync command line found", ex.name));
        }
        if ex.expects.is_empty() {
            failures.push(format!("{}: no expect directive", ex.name));
        }
        for n in &ex.bare {
            failures.push(format!(
                "{}:{n}: call packsync as {BIN}: by bare name it fails with \
                 `packsync: not found` (127) in an image whose PATH lacks /usr/local/bin",
                ex.name
            ));
        }
        failures.extend(run(ex));
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_reader_of_the_examples_finds_commands_and_directives() {
    let ex = parse(
        "t.yaml",
        "# packsync-test: source /img examples/packs\n\
         # packsync-test: image /vol examples/system-packs\n\
         # packsync-test: volume /vol\n\
         # packsync-test: same /mnt/v /vol\n\
         # packsync-test: env V=1.0\n\
         # packsync-test: expect /vol/x examples/packs\n\
         #   packsync sync /not /a-command\n\
         args:\n\
           - |\n\
             packsync sync /img /vol/x --label \"$V\"\n\
         \x20\x20- packsync wait /vol/x\n\
             exec packsync exec /vol/x -- true\n\
             exec st2-register-content --config-file /etc/st2/st2.conf\n",
    );
    assert_eq!(
        ex.sources,
        [("/img".to_string(), "examples/packs".to_string())]
    );
    assert_eq!(ex.volumes, ["/vol"]);
    assert_eq!(ex.env, [("V".to_string(), "1.0".to_string())]);
    let cmds: Vec<&str> = ex.commands.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        cmds,
        [
            "packsync sync /img /vol/x --label \"$V\"",
            "packsync wait /vol/x",
            "packsync exec /vol/x -- true"
        ]
    );
    assert_eq!(
        rewrite(cmds[0], Path::new("/tmp/R")),
        "packsync sync /tmp/R/img /tmp/R/vol/x --label \"$V\""
    );
    // The image's own /vol as a SOURCE, the volume's /vol as DEST; /mnt/v is /vol.
    assert_eq!(
        localize(&ex, "packsync sync /vol /mnt/v/x --slot s"),
        "packsync sync /.image/vol /vol/x --slot s"
    );
    assert_eq!(localize(&ex, "packsync wait /vol"), "packsync wait /vol");
    assert_eq!(
        localize(&ex, "packsync wait /mnt/vx"),
        "packsync wait /mnt/vx"
    );
}

#[test]
fn the_reader_of_the_examples_takes_the_absolute_path_and_flags_bare_names() {
    let ex = parse(
        "t.yaml",
        "args:\n\
           - |\n\
             /usr/local/bin/packsync sync /img /vol/x --label \"$V\"\n\
             exec /usr/local/bin/packsync exec /vol/x -- true\n\
             packsync wait /vol/x\n\
             /usr/local/bin/packsyncx wait /vol/x\n",
    );
    let cmds: Vec<&str> = ex.commands.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        cmds,
        [
            "packsync sync /img /vol/x --label \"$V\"",
            "packsync exec /vol/x -- true",
            "packsync wait /vol/x"
        ]
    );
    assert_eq!(ex.bare, [5]);
}

/// The script of the init container `name` in manifest `file`: the lines
/// of its `- |` block, unindented.
fn init_script(file: &str, name: &str) -> Vec<String> {
    let text = fs::read_to_string(repo().join("examples/kubernetes").join(file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("{file}: no container {name}"));
    let bar = at
        + lines[at..]
            .iter()
            .position(|l| l.trim() == "- |")
            .unwrap_or_else(|| panic!("{file}: {name} has no `- |` script"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    lines[bar + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > indent(lines[bar]))
        .map(|l| l.trim().to_string())
        .collect()
}

/// `kubectl rollout undo` as the StackStorm manifest documents it: the
/// publisher's whole script, run as the init container runs it (`sh -ec`,
/// the binary at /usr/local/bin/packsync, PACKS_PINNED from the optional
/// ConfigMap), for pods of two pack versions.
#[test]
fn the_stackstorm_rollback_path_works_with_a_rollout_undo() {
    let script = init_script("stackstorm-packs.yaml", "publish-packs");
    assert!(
        script.iter().any(|l| l.contains("PACKS_PINNED")),
        "{script:?}"
    );
    let tmp = tempfile::Builder::new()
        .prefix("packsync-rollback")
        .tempdir()
        .unwrap();
    let root = tmp.path();
    let script: Vec<String> = script.iter().map(|l| rewrite(l, root)).collect();
    let under = |p: &str| root.join(p.trim_start_matches('/'));
    fs::create_dir_all(under("/usr/local/bin")).unwrap();
    symlink(bin(), under("/usr/local/bin/packsync")).unwrap();
    for v in ["/opt/stackstorm/packs", "/opt/stackstorm/virtualenvs"] {
        fs::create_dir_all(under(v)).unwrap();
    }
    // One image per version: 1.2.0 has an action that 1.1.0 lacks.
    let image = |version: &str| {
        let img = root.join(format!("image-{version}"));
        if !img.exists() {
            copy_tree(&repo().join("examples/packs"), &img.join("packs"));
            copy_tree(
                &repo().join("examples/virtualenvs"),
                &img.join("virtualenvs"),
            );
            if version == "1.2.0" {
                fs::write(img.join("packs/hello_st2/actions/new.yaml"), "name: new\n").unwrap();
            }
        }
        let at = under("/opt/packs-image");
        let _ = fs::remove_file(&at);
        symlink(&img, &at).unwrap();
    };
    let pod = |version: &str, pinned: Option<&str>| {
        image(version);
        let out = crate::fixture::clean_env(&mut Command::new("sh"))
            .arg("-ec")
            .arg(script.join("\n"))
            .env("PACK_VERSION", version)
            .env_remove("PACKS_PINNED")
            .envs(pinned.map(|p| ("PACKS_PINNED", p)))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let packs = under("/opt/stackstorm/packs");
    // The whole volume (refusals must leave it as it was), and the live tree.
    let live = || {
        let p = packs.join("hello_st2/actions/new.yaml");
        (listing(&packs), p.exists())
    };
    let tree = || listing(&packs.join("..data-packs"));
    assert_eq!(pod("1.1.0", None), (Some(0), String::new()));
    assert_eq!(pod("1.2.0", None).0, Some(0));
    let v2 = live();
    assert!(v2.1, "1.2.0 is live");
    let v2_hello = listing(&packs.join("hello_st2"));
    // The undo alone: the 1.1.0 pods are refused, the volume stays on 1.2.0.
    let (code, err) = pod("1.1.0", None);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("--allow-downgrade"), "{err}");
    assert_eq!(live(), v2);
    // Pinned: the 1.1.0 pods publish, a 1.2.0 replica restarting is refused.
    assert_eq!(pod("1.1.0", Some("1.1.0")).0, Some(0));
    let v1 = live();
    assert!(!v1.1, "1.1.0 is live again: the action 1.2.0 added is gone");
    let (code, err) = pod("1.2.0", Some("1.1.0"));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("packs are pinned to 1.1.0 (ConfigMap packsync-pin): not publishing 1.2.0"),
        "{err}"
    );
    assert_eq!(live(), v1);
    // Still pinned, a 1.1.0 pod restarting is up to date; unpinned, the next upgrade goes through.
    assert_eq!(pod("1.1.0", Some("1.1.0")).0, Some(0));
    assert_eq!(live(), v1);
    let tree_v1 = tree();
    assert_eq!(pod("1.2.0", None).0, Some(0));
    assert!(live().1, "1.2.0 is live again");
    assert_ne!(tree(), tree_v1);
    assert_eq!(listing(&packs.join("hello_st2")), v2_hello);
}
