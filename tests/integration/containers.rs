//! The Kubernetes examples in real containers: `../shared/container-rig.sh`
//! gives podman (`podman kube play`), buildah and a private image store.
//! The test builds the images the manifest names (the packsync image as the
//! Dockerfile's final stage: `FROM scratch` plus the static binary; a
//! consumer image and pack images from the rig's busybox), plays the
//! manifest's Deployments and Job as Pods, and checks what an operator
//! would. StackStorm: the init containers published the pack image's packs
//! and the st2 image's own system packs (each in its slot), a consumer started on
//! an empty volume waits and then starts, the register-content step runs
//! after the packs are live, an upgrade removes the action it dropped, and
//! a replica of the old version is refused (exit 3) with the volume
//! unchanged. OPA: three replicas started at once leave one generation,
//! which every OPA (a stand-in that prints what it loads) reads. Two pack
//! images: both slots and the st2 image's system packs are published and
//! the consumer starts. The loop
//! examples (native sidecars run as containers) and the ones that read a
//! registry or a bundle server (on the host's network) are played too.
//!
//! The harness maps image names to the local ones, plays a Deployment's or
//! Job's pod template as a Pod with `restartPolicy: Never` (podman 4.3
//! restarts an init container that exits 0 under Always), and drops
//! `ports:` (`--network none`) and readiness probes (ignored by podman),
//! and makes the claims' volumes beforehand with `nocopy` (a podman named
//! volume made on first use is filled from the image, a claim never is);
//! nothing else in the manifest changes, except the version an upgrade
//! bumps (image tag and PACK_VERSION together). The pods run as UID and GID
//! 1000 (the manifests' securityContext), so a claim's volume is given the
//! pods' fsGroup as the kubelet would (`fs_group`).
//!
//! Needs root, the rig and the static release binary
//! (target/x86_64-unknown-linux-gnu/release/packsync, which CI builds
//! first; `PACKSYNC_STATIC_BIN` names another). Without them the test is
//! skipped with one line, and fails under CI (`CI` set).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::examples::{copy_tree, listing};
use crate::fixture::is_root;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    std::env::var_os("CONTAINER_RIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/container-rig.sh"))
}

fn static_bin() -> PathBuf {
    std::env::var_os("PACKSYNC_STATIC_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/x86_64-unknown-linux-gnu/release/packsync"))
}

/// Skip with one line, or fail under CI.
#[track_caller]
fn unavailable(why: &str) {
    crate::fixture::skip(&format!("container tests: {why}"));
}

/// One rig in a private directory, with a registry on a free port; `down` when dropped.
pub(crate) struct Rig {
    pub(crate) env: Vec<(String, String)>,
}

impl Rig {
    pub(crate) fn up() -> Result<Rig, String> {
        let dir = std::env::temp_dir().join(format!("packsync-containers-{}", std::process::id()));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free port: {e}"))?;
        let mut rig = Rig {
            env: vec![
                ("CONTAINER_RIG_DIR".into(), dir.display().to_string()),
                ("CONTAINER_RIG_REGISTRY_PORT".into(), port.to_string()),
            ],
        };
        let up = rig.run("up")?;
        if !up.status.success() {
            return Err(format!(
                "`container-rig.sh up` failed: {}",
                String::from_utf8_lossy(&up.stderr)
            ));
        }
        let env = rig.run("env")?;
        for line in String::from_utf8_lossy(&env.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                rig.env.push((k.to_string(), v.to_string()));
            }
        }
        Ok(rig)
    }

    fn run(&self, cmd: &str) -> Result<Output, String> {
        Command::new("bash")
            .arg(script())
            .arg(cmd)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script().display()))
    }

    pub(crate) fn var(&self, k: &str) -> &str {
        &self.env.iter().rev().find(|(n, _)| n == k).unwrap().1
    }

    fn tool(&self, name: &str) -> Command {
        let mut c = Command::new(name);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Run a tool; its stdout, or a panic with its stderr.
    #[track_caller]
    fn ok(&self, name: &str, args: &[&str]) -> String {
        let out = self.tool(name).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Build `image` from `base` (`scratch` or an image), with `files`
    /// (host path, path in the image) and buildah config arguments.
    fn build(&self, image: &str, base: &str, files: &[(&Path, &str)], config: &[&str]) {
        let c = self.ok("buildah", &["from", "-q", base]);
        for (from, to) in files {
            self.ok("buildah", &["copy", "-q", &c, from.to_str().unwrap(), to]);
        }
        if !config.is_empty() {
            let mut args = vec!["config"];
            args.extend_from_slice(config);
            args.push(&c);
            self.ok("buildah", &args);
        }
        self.ok("buildah", &["commit", "-q", &c, image]);
        self.ok("buildah", &["rm", &c]);
    }

    /// `podman kube play` a Pod file: its exit code and stderr.
    fn play(&self, file: &Path) -> (Option<i32>, String) {
        let out = self.kube_play(file).wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn kube_play(&self, file: &Path) -> Child {
        self.kube_play_on(file, "none")
    }

    /// `kube play` on `network` ("host": the host's own, to reach the rig's registry).
    fn kube_play_on(&self, file: &Path, network: &str) -> Child {
        self.tool("podman")
            .args(["kube", "play", "--network", network])
            .arg(file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn down(&self, file: &Path) {
        let _ = self
            .tool("podman")
            .args(["kube", "down"])
            .arg(file)
            .output();
    }

    /// A claim's volume as a PersistentVolumeClaim starts: empty (made
    /// beforehand with `nocopy`: a podman named volume made on first use is
    /// filled from the image at its mount point) and writable by the pods'
    /// fsGroup (`fs_group`). Podman also gives a new volume, at its first
    /// mount, the owner and mode of the directory it covers in that image
    /// (root, 0755 for /opt/stackstorm/packs in the st2 image), which would
    /// undo the fsGroup: one mount where nothing is covered spends that rule
    /// before the group is set.
    fn claim(&self, name: &str) {
        self.ok("podman", &["volume", "create", "-o", "nocopy", name]);
        let busybox = self.var("CONTAINER_RIG_BUSYBOX_IMAGE").to_string();
        let mount = format!("{name}:/packsync-claim");
        self.ok(
            "podman",
            &[
                "run",
                "--rm",
                "--network",
                "none",
                "-v",
                &mount,
                &busybox,
                "true",
            ],
        );
        fs_group(&self.volume(name));
    }

    /// A named volume's directory on this host.
    fn volume(&self, name: &str) -> PathBuf {
        PathBuf::from(self.ok(
            "podman",
            &["volume", "inspect", name, "--format", "{{.Mountpoint}}"],
        ))
    }

    /// The exit code of container `name` (POD-CONTAINER), once it has ended.
    fn exit_code(&self, name: &str) -> String {
        self.ok("podman", &["wait", name])
    }

    /// What the containers `names` printed, for a failure's message.
    fn logs(&self, names: &[&str]) -> String {
        let mut out = String::new();
        for n in names {
            if let Ok(o) = self.tool("podman").args(["logs", n]).output() {
                out += &format!(
                    "\n{n}: {}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        out
    }

    /// Poll `cond` every 100 ms for two minutes at most; failing, the
    /// message says `what` and what the `containers` printed.
    #[track_caller]
    fn until(&self, containers: &[&str], what: &str, cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}{}",
                self.logs(containers)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn running(&self, name: &str) -> bool {
        self.tool("podman")
            .args([
                "container",
                "inspect",
                name,
                "--format",
                "{{.State.Running}}",
            ])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        match self.run("down") {
            Ok(o) if o.status.success() => {}
            other => eprintln!("container-rig.sh down failed: {other:?}"),
        }
    }
}

/// The examples' fsGroup (tests/integration/manifests.rs checks that every
/// pod sets one and runs as a fixed non-root user).
const FS_GROUP: u32 = 1000;

/// What the kubelet does to a volume for a pod's fsGroup, where the
/// volume's driver supports ownership changes: the group, setgid and
/// group-writable on its root. podman applies no fsGroup, and the examples'
/// pods run as UID and GID 1000, not root.
fn fs_group(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::chown(dir, None, Some(FS_GROUP)).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o2775)).unwrap();
}

/// Serialise container rig users of this machine.
pub(crate) fn rig_lock() -> fs::File {
    let f = fs::File::create(std::env::temp_dir().join("packsync-container-rig.lock")).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    f
}

fn indent(l: &str) -> usize {
    l.len() - l.trim_start().len()
}

/// Drop each block whose key is one of `keys` (the line and every deeper one).
fn drop_blocks(lines: Vec<String>, keys: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_deeper: Option<usize> = None;
    for l in lines {
        if let Some(d) = skip_deeper {
            if l.trim().is_empty() || indent(&l) > d {
                continue;
            }
            skip_deeper = None;
        }
        let t = l.trim_start();
        if keys.iter().any(|k| t == format!("{k}:")) {
            skip_deeper = Some(indent(&l));
            continue;
        }
        out.push(l);
    }
    out
}

/// Native sidecars (init containers with `restartPolicy: Always`, which
/// Kubernetes starts in order and keeps running) as ordinary containers:
/// podman 4.3 runs every init container to its end, so a sidecar loop would
/// hold the pod in Init for ever. `spec` is a pod spec's lines, keys at
/// two spaces, list items at four.
fn sidecars_as_containers(spec: Vec<String>) -> Vec<String> {
    let Some(init) = spec.iter().position(|l| l == "  initContainers:") else {
        return spec;
    };
    let end = init
        + 1
        + spec[init + 1..]
            .iter()
            .position(|l| indent(l) <= 2)
            .unwrap_or(spec.len() - init - 1);
    let mut items: Vec<Vec<String>> = Vec::new();
    for l in &spec[init + 1..end] {
        if l.starts_with("    - ") || items.is_empty() {
            items.push(Vec::new());
        }
        items.last_mut().unwrap().push(l.clone());
    }
    let (sidecars, init_items): (Vec<_>, Vec<_>) = items
        .into_iter()
        .partition(|item| item.iter().any(|l| l == "      restartPolicy: Always"));
    let mut out: Vec<String> = spec[..init].to_vec();
    if !init_items.is_empty() {
        out.push(spec[init].clone());
        out.extend(init_items.into_iter().flatten());
    }
    for l in &spec[end..] {
        out.push(l.clone());
        if l == "  containers:" {
            out.extend(sidecars.iter().flatten().cloned());
        }
    }
    out
}

/// The Pods a manifest's documents become: `(name, Pod YAML)` for each
/// Deployment, Job or Pod, with images mapped by `images`.
fn pods(manifest: &str, images: &HashMap<&str, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in manifest.split("\n---\n") {
        let lines: Vec<&str> = doc.lines().collect();
        let kind = lines.iter().find_map(|l| l.strip_prefix("kind: "));
        let Some(kind @ ("Deployment" | "Job" | "Pod")) = kind.map(str::trim) else {
            continue;
        };
        let meta = lines.iter().position(|l| *l == "metadata:").unwrap();
        let name = lines[meta + 1..]
            .iter()
            .find_map(|l| l.strip_prefix("  name: "))
            .unwrap()
            .trim()
            .to_string();
        // The pod spec: top-level `spec:` for a Pod, the template's otherwise.
        let (at, depth) = if kind == "Pod" {
            (lines.iter().position(|l| *l == "spec:").unwrap(), 0)
        } else {
            let t = lines.iter().position(|l| *l == "  template:").unwrap();
            let s = t + lines[t..].iter().position(|l| *l == "    spec:").unwrap();
            (s, 4)
        };
        let spec: Vec<String> = lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > depth)
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|l| l[depth..].to_string())
            .collect();
        let spec: Vec<String> = sidecars_as_containers(spec)
            .into_iter()
            .filter(|l| !l.trim_start().starts_with("restartPolicy:"))
            .map(|l| match l.trim_start().strip_prefix("image: ") {
                Some(img) => {
                    // A YAML comment may follow the name.
                    let img = img.split(" #").next().unwrap_or(img);
                    let local = images
                        .get(img.trim())
                        .unwrap_or_else(|| panic!("no local image for {img}"));
                    format!("{}image: {local}", &l[..indent(&l)])
                }
                None => l,
            })
            .collect();
        let spec = drop_blocks(spec, &["ports", "readinessProbe"]);
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Never\n{}\n",
            spec.join("\n")
        );
        out.push((name, pod));
    }
    out
}

/// Image names as the manifest writes them, mapped to the local ones.
fn image_map<'a>(pairs: &[(&'a str, &str)]) -> HashMap<&'a str, String> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// `expect` of examples.rs, in the volume's own directory on the host.
#[track_caller]
fn assert_published(vol: &Path, repo_dir: &str) {
    for e in fs::read_dir(repo().join(repo_dir)).unwrap() {
        let name = e.unwrap().file_name();
        assert_eq!(
            listing(&vol.join(&name)),
            listing(&repo().join(repo_dir).join(&name)),
            "{} in the volume",
            name.to_string_lossy()
        );
    }
}

/// The rig, held under the lock, and the static binary; `None` (after one
/// line, or a panic under CI) when either is missing. The rig goes down
/// before the lock is released.
struct Setup {
    /// This test's work directory (first, so it goes before the rig does).
    work: tempfile::TempDir,
    rig: Rig,
    bin: PathBuf,
    _lock: fs::File,
}

fn setup() -> Option<Setup> {
    if !is_root() {
        unavailable("need root");
        return None;
    }
    if !script().exists() {
        unavailable(&format!("{} is missing", script().display()));
        return None;
    }
    let bin = static_bin();
    if !bin.exists() {
        unavailable(&format!(
            "{} is missing (RUSTFLAGS='-C target-feature=+crt-static' cargo build --release \
             --target x86_64-unknown-linux-gnu)",
            bin.display()
        ));
        return None;
    }
    let lock = rig_lock();
    match Rig::up() {
        Ok(rig) => Some(Setup {
            work: tempfile::Builder::new()
                .prefix("packsync-containers")
                .tempdir()
                .unwrap(),
            rig,
            bin,
            _lock: lock,
        }),
        Err(e) => {
            unavailable(&format!(
                "the rig did not come up (it installs podman, buildah, skopeo, runc, \
                 docker-registry, busybox-static, catatonit): {e}"
            ));
            None
        }
    }
}

#[test]
fn the_stackstorm_example_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();

    // The images, with no registry from outside.
    stackstorm_images(rig, bin, work);
    let images = image_map(&[
        (
            "registry.example.com/st2packs-example:1.2.0",
            "localhost/st2packs-example:1.2.0",
        ),
        (
            "registry.example.com/st2packs-example:1.3.0",
            "localhost/st2packs-example:1.3.0",
        ),
        (
            "registry.example.com/st2actionrunner-packsync:3.8",
            "localhost/st2actionrunner-packsync:3.8",
        ),
        (
            "stackstorm/st2api:3.8",
            "localhost/st2actionrunner-packsync:3.8",
        ),
    ]);

    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/stackstorm-packs.yaml")).unwrap();
    let write_pods = |text: &str, tag: &str| -> BTreeMap<String, PathBuf> {
        pods(text, &images)
            .into_iter()
            .map(|(name, yaml)| {
                let p = work.join(format!("{name}-{tag}.yaml"));
                fs::write(&p, yaml).unwrap();
                (name, p)
            })
            .collect()
    };
    let v1 = write_pods(&manifest, "v1");
    let names: Vec<&str> = v1.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["st2-register-content-1-2-0", "st2actionrunner", "st2api"],
        "the manifest's workloads"
    );

    // A PersistentVolumeClaim starts empty. A podman named volume made on
    // first use is filled from the image at its mount point (Docker's rule),
    // which here would put the st2 image's system packs into the volume
    // before any publisher ran: made beforehand without that copy.
    for claim in ["st2-packs", "st2-virtualenvs"] {
        rig.claim(claim);
    }

    // A consumer on an empty volume waits in its init container.
    let mut consumer = rig.kube_play(&v1["st2actionrunner"]);
    let waiting = "st2actionrunner-wait-for-packs";
    let mut seen = false;
    for _ in 0..600 {
        if rig.running(waiting) {
            seen = true;
            break;
        }
        assert!(
            consumer.try_wait().unwrap().is_none(),
            "the consumer's play ended early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(seen, "{waiting} never ran");
    assert!(
        consumer.try_wait().unwrap().is_none(),
        "the consumer did not wait"
    );

    // The publisher's init container publishes; the consumer then starts.
    let (code, err) = rig.play(&v1["st2api"]);
    // kube play exits 0 only when every init container did (they are removed once run).
    assert_eq!(
        code,
        Some(0),
        "st2api: {err}{}",
        rig.logs(&["st2api-publish-system-packs", "st2api-publish-packs"])
    );
    let packs = rig.volume("st2-packs");
    let venvs = rig.volume("st2-virtualenvs");
    assert_published(&packs, "examples/packs");
    assert_published(&packs, "examples/system-packs");
    assert_published(&venvs, "examples/virtualenvs");
    let out = consumer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "st2actionrunner: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rig.exit_code("st2actionrunner-st2actionrunner"), "0");

    // Registration runs once this version's packs are live.
    let (code, err) = rig.play(&v1["st2-register-content-1-2-0"]);
    assert_eq!(code, Some(0), "register-content: {err}");
    let job = "st2-register-content-1-2-0-st2-register-content";
    assert_eq!(rig.exit_code(job), "0");
    let log = rig.ok("podman", &["logs", job]);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 4, "{job}: {log}");
    assert!(
        lines[0].starts_with("packsync: /opt/stackstorm/virtualenvs: generation ")
            && lines[0].ends_with(" (label 1.2.0) is live")
            && lines[1].starts_with("packsync: /opt/stackstorm/packs (slot system): generation ")
            && lines[1].ends_with(" (label 3.8.0) is live")
            && lines[2].starts_with("packsync: /opt/stackstorm/packs (slot packs): generation ")
            && lines[2].ends_with(" (label 1.2.0) is live"),
        "{job}: {log}"
    );
    // The system packs of the st2 image beside the pack image's.
    assert_eq!(
        lines[3], "registered: core examples_ops hello_st2 linux packs",
        "{job}"
    );

    // An execution that spans the upgrade, in a pod of its own: pinned by
    // `packsync exec` to the generation live when it started.
    let signal = work.join("signal");
    fs::create_dir_all(&signal).unwrap();
    let exec_pod = work.join("st2-execution.yaml");
    fs::write(
        &exec_pod,
        EXECUTION_POD.replace("SIGNAL", &signal.display().to_string()),
    )
    .unwrap();
    let (code, err) = rig.play(&exec_pod);
    assert_eq!(code, Some(0), "st2-execution: {err}");
    let execution = "st2-execution-run";
    rig.until(&[execution], "SIGNAL/started never appeared", || {
        signal.join("started").exists()
    });
    // A reader in another pod, reading through DEST over and over during the upgrade.
    let reader_pod = work.join("st2-reader.yaml");
    fs::write(
        &reader_pod,
        READER_POD.replace("SIGNAL", &signal.display().to_string()),
    )
    .unwrap();
    let (code, err) = rig.play(&reader_pod);
    assert_eq!(code, Some(0), "st2-reader: {err}");
    let reader = "st2-reader-read";
    rig.until(&[reader], "SIGNAL/reading never appeared", || {
        signal.join("reading").exists()
    });

    // The upgrade: image tag and PACK_VERSION bumped; the dropped action is gone.
    rig.down(&v1["st2api"]);
    let v2 = write_pods(&manifest.replace("1.2.0", "1.3.0"), "v2");
    let (code, err) = rig.play(&v2["st2api"]);
    assert_eq!(code, Some(0), "st2api 1.3.0: {err}");
    let actions = packs.join("examples_ops/actions");
    assert!(actions.join("disk_usage.yaml").exists());
    assert!(
        !actions.join("load_average.yaml").exists(),
        "the removed action is gone"
    );

    // The reader saw the old version, then the new one, and never a mix.
    let seen = |v: &str| {
        fs::read_to_string(signal.join("reads"))
            .unwrap_or_default()
            .lines()
            .any(|l| l == v)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !seen("0.5.0 new") {
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never saw 1.3.0 (running: {}); its reads: {:?}{}",
            rig.running(reader),
            {
                let mut r: Vec<String> = fs::read_to_string(signal.join("reads"))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_string)
                    .collect();
                r.dedup();
                r
            },
            rig.logs(&[reader])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fs::write(signal.join("stop"), "").unwrap();
    assert_eq!(rig.exit_code(reader), "0", "{}", rig.logs(&[reader]));
    let reads = fs::read_to_string(signal.join("reads")).unwrap();
    let mut kinds: Vec<&str> = reads.lines().collect();
    kinds.dedup();
    assert_eq!(
        kinds,
        ["0.4.1 old", "0.5.0 new"],
        "{} reads",
        reads.lines().count()
    );
    eprintln!(
        "containers: the reader read the pack {} times across the upgrade, never a mix",
        reads.lines().count()
    );
    rig.down(&reader_pod);

    // The execution still reads 1.2.0, whole, and its lease keeps it from
    // the collector, whatever the grace period: a gc from the host now
    // removes nothing of the packs slot.
    let slot_gens = packs.join("..packsync/slots/packs/gen");
    let gens = || -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&slot_gens)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(gens().len(), 2, "1.2.0 and 1.3.0: {:?}", gens());
    let gc = || {
        let out = crate::fixture::packsync()
            .args(["gc", "--keep", "0", "--grace", "0"])
            .arg(&packs)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    gc();
    assert_eq!(
        gens().len(),
        2,
        "the leased 1.2.0 was collected: {:?}",
        gens()
    );
    fs::write(signal.join("go"), "").unwrap();
    assert_eq!(rig.exit_code(execution), "0", "{}", rig.logs(&[execution]));
    let before = fs::read_to_string(signal.join("before")).unwrap();
    let after = fs::read_to_string(signal.join("after")).unwrap();
    assert!(
        before.contains("./examples_ops/actions/load_average.yaml"),
        "{before}"
    );
    assert_eq!(before, after, "the execution's tree changed under it");
    // Once it has ended, its generation goes with the next collection.
    gc();
    assert_eq!(gens().len(), 1, "1.3.0 alone: {:?}", gens());
    rig.down(&exec_pod);

    // An old replica restarting during the rollout is refused, and changes nothing.
    rig.down(&v2["st2api"]);
    let before = (listing(&packs), listing(&venvs));
    let (code, err) = rig.play(&v1["st2api"]);
    assert_ne!(code, Some(0), "the 1.2.0 replica was not refused: {err}");
    let log = rig
        .tool("podman")
        .args(["logs", "st2api-publish-packs"])
        .output()
        .unwrap();
    let log = format!(
        "{err}{}",
        String::from_utf8_lossy(&[log.stdout, log.stderr].concat())
    );
    eprintln!("containers: the refused replica: {log}");
    assert!(
        err.contains("exited with code 3"),
        "the refusal is exit 3: {err}"
    );
    assert!(
        log.contains("labelled 1.3.0 with older 1.2.0"),
        "st2api-publish-packs: {log}"
    );
    assert_eq!(
        (listing(&packs), listing(&venvs)),
        before,
        "the volumes are unchanged"
    );
    eprintln!(
        "containers: StackStorm example played as pods: consumer waited on an empty volume, \
         publisher published 1.2.0 and the system packs, registration saw all five packs, \
         1.3.0 removed an action while an execution pinned to 1.2.0 read it whole and kept it \
         from gc until it ended and a reader in another pod never saw a mix, \
         a 1.2.0 replica was refused (exit 3) with the volumes unchanged"
    );
}

/// The StackStorm example's images: the packsync image (`FROM scratch`
/// plus the binary), the st2 image with its system packs and the binary,
/// and the pack image at 1.2.0 and 1.3.0 (which drops an action and bumps
/// its pack's version).
fn stackstorm_images(rig: &Rig, bin: &Path, work: &Path) {
    let busybox = rig.var("CONTAINER_RIG_BUSYBOX_IMAGE").to_string();
    rig.build(
        "localhost/packsync-image:test",
        "scratch",
        &[(bin, "/packsync")],
        &["--entrypoint", r#"["/packsync"]"#],
    );
    let version = rig.ok(
        "podman",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "localhost/packsync-image:test",
            "--version",
        ],
    );
    assert!(version.starts_with("packsync "), "{version}");
    // A stand-in for st2-register-content: it lists what it would register.
    let register = work.join("st2-register-content");
    fs::write(
        &register,
        "#!/bin/sh\necho \"registered: $(ls /opt/stackstorm/packs | tr '\\n' ' ')\"\n",
    )
    .unwrap();
    fs::set_permissions(
        &register,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // The st2 image ships its system packs where the volume is mounted.
    rig.build(
        "localhost/st2actionrunner-packsync:3.8",
        &busybox,
        &[
            (bin, "/usr/local/bin/packsync"),
            (&register, "/bin/st2-register-content"),
            (
                &repo().join("examples/system-packs"),
                "/opt/stackstorm/packs",
            ),
        ],
        &["--label", "org.opencontainers.image.version=3.8.0"],
    );
    for v in ["1.2.0", "1.3.0"] {
        let tree = work.join(format!("pack-{v}"));
        copy_tree(&repo().join("examples/packs"), &tree.join("packs"));
        copy_tree(
            &repo().join("examples/virtualenvs"),
            &tree.join("virtualenvs"),
        );
        if v == "1.3.0" {
            for f in ["load_average.py", "load_average.yaml"] {
                fs::remove_file(tree.join("packs/examples_ops/actions").join(f)).unwrap();
            }
            // The pack's version moves with the action it dropped: a reader
            // that saw one without the other saw a mixed tree.
            let meta = tree.join("packs/examples_ops/pack.yaml");
            let text = fs::read_to_string(&meta).unwrap();
            fs::write(&meta, text.replace("version: 0.4.1", "version: 0.5.0")).unwrap();
            // The image keeps whole seconds, and both versions are built in
            // the same one: as an edit made later would, it gets a later
            // mtime. (A directory source is compared by size and mtime; an
            // image build that gives every file one mtime needs --checksum,
            // or an oci:// source, which compares by content.)
            let later = std::time::SystemTime::now() + Duration::from_secs(3600);
            fs::File::options()
                .write(true)
                .open(&meta)
                .unwrap()
                .set_modified(later)
                .unwrap();
        }
        rig.build(
            &format!("localhost/st2packs-example:{v}"),
            &busybox,
            &[
                (bin, "/usr/local/bin/packsync"),
                (&tree.join("packs"), "/opt/packs-image/packs"),
                (&tree.join("virtualenvs"), "/opt/packs-image/virtualenvs"),
            ],
            &["--label", &format!("org.opencontainers.image.version={v}")],
        );
    }
}

/// A StackStorm execution stand-in: under `packsync exec` (which needs the
/// volume writable, for its lease) it lists and checksums its tree, says
/// so in SIGNAL/started, waits for SIGNAL/go, and does it again.
const EXECUTION_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: st2-execution
spec:
  restartPolicy: Never
  containers:
    - name: run
      image: localhost/st2actionrunner-packsync:3.8
      command: ["/bin/sh", "-ec"]
      args:
        - |
          /usr/local/bin/packsync exec /opt/stackstorm/packs --slot packs -- /bin/sh -ec 'cd "$PACKSYNC_ROOT"; find . -type f | sort | xargs md5sum > /signal/before; touch /signal/started; while [ ! -e /signal/go ]; do sleep 0.1; done; find . -type f | sort | xargs md5sum > /signal/after'
      volumeMounts:
        - name: packs
          mountPath: /opt/stackstorm/packs
        - name: signal
          mountPath: /signal
  volumes:
    - name: packs
      persistentVolumeClaim:
        claimName: st2-packs
    - name: signal
      hostPath:
        path: SIGNAL
        type: Directory
"#;

/// A second pod reading the packs through DEST while they are upgraded:
/// each read enters the pack once (`cd` resolves the links once) and notes
/// which version its pack.yaml names and whether the action that 1.3.0
/// dropped is there ("old", "new"; a mix would be "0.5.0 old" or
/// "0.4.1 new"; a read that fails notes "failed"), until SIGNAL/stop.
const READER_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: st2-reader
spec:
  restartPolicy: Never
  containers:
    - name: read
      image: localhost/st2actionrunner-packsync:3.8
      command: ["/bin/sh", "-ec"]
      args:
        - |
          touch /signal/reading
          while [ ! -e /signal/stop ]; do
            (cd /opt/stackstorm/packs/examples_ops && v=$(sed -n 's/^version: //p' pack.yaml) && if [ -e actions/load_average.yaml ]; then echo "$v old"; else echo "$v new"; fi) >> /signal/reads || echo "failed $?" >> /signal/reads
          done
      volumeMounts:
        - name: packs
          mountPath: /opt/stackstorm/packs
          readOnly: true
        - name: signal
          mountPath: /signal
  volumes:
    - name: packs
      persistentVolumeClaim:
        claimName: st2-packs
    - name: signal
      hostPath:
        path: SIGNAL
        type: Directory
"#;

/// Build the packsync image (the Dockerfile's final stage); the rig's
/// busybox image, the base of the others.
fn base_images(rig: &Rig, bin: &Path) -> String {
    rig.build(
        "localhost/packsync-image:test",
        "scratch",
        &[(bin, "/packsync")],
        &["--entrypoint", r#"["/packsync"]"#],
    );
    rig.var("CONTAINER_RIG_BUSYBOX_IMAGE").to_string()
}

/// The OPA example's images (the bundle image, and a stand-in for OPA that
/// prints what it loads), and its Deployment's pod.
fn opa_pod(rig: &Rig, bin: &Path, busybox: &str, work: &Path) -> String {
    rig.build(
        "localhost/opa-policies:1.4.0",
        busybox,
        &[
            (bin, "/usr/local/bin/packsync"),
            (&repo().join("examples/opa-bundle"), "/bundles"),
        ],
        &[],
    );
    let opa = work.join("opa");
    fs::write(
        &opa,
        "#!/bin/sh\nfor a; do dir=$a; done\ncd \"$dir\" && echo \"loaded: $(find . -type f | sort | tr '\\n' ' ')\"\n",
    )
    .unwrap();
    fs::set_permissions(&opa, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    rig.build(
        "localhost/opa-standin:1",
        busybox,
        &[(&opa, "/bin/opa")],
        &["--entrypoint", r#"["/bin/opa"]"#],
    );
    let images = image_map(&[
        (
            "registry.example.com/opa-policies:1.4.0",
            "localhost/opa-policies:1.4.0",
        ),
        ("openpolicyagent/opa:1.4.2", "localhost/opa-standin:1"),
    ]);
    let manifest = fs::read_to_string(repo().join("examples/kubernetes/opa-bundles.yaml")).unwrap();
    let pods_of = pods(&manifest, &images);
    assert_eq!(pods_of.len(), 1, "one Deployment");
    let (name, yaml) = pods_of.into_iter().next().unwrap();
    assert_eq!(name, "opa");
    yaml
}

/// The claim `claim` of a pod bound to a directory of this host (a
/// network filesystem's mount, as a node's kubelet would mount it).
fn claim_on(yaml: &str, claim: &str, dir: &Path) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim() == "persistentVolumeClaim:"
            && lines.get(i + 1).map(|n| n.trim()) == Some(&format!("claimName: {claim}"))
        {
            let pad = &l[..indent(l)];
            let inner = &lines[i + 1][..indent(lines[i + 1])];
            out.push(format!("{pad}hostPath:"));
            out.push(format!("{inner}path: {}", dir.join(claim).display()));
            out.push(format!("{inner}type: DirectoryOrCreate"));
            i += 2;
            continue;
        }
        out.push(l.to_string());
        i += 1;
    }
    assert_ne!(out.join("\n"), yaml.trim_end(), "no claim {claim}");
    out.join("\n") + "\n"
}

/// The OPA example on CephFS, the usual ReadWriteMany volume: two nodes,
/// each with its own ceph-fuse mount of one file system (the netfs rig's
/// cephfs backend), three replicas started at once, two on one node and
/// one on the other, their claim bound to the node's mount. They leave one
/// generation, seen whole from both mounts, and every OPA stand-in loads
/// the bundle; a replica restarted on either node leaves that generation live.
#[test]
fn the_opa_example_on_two_cephfs_clients_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    if !crate::faults::netfs::script().exists() {
        unavailable("the netfs rig script is missing");
        return;
    }
    let _netfs_lock = crate::faults::netfs::rig_lock();
    let ceph = match crate::faults::netfs::Rig::up("cephfs") {
        Ok(r) => r,
        Err(e) => {
            unavailable(&format!("the CephFS rig did not come up: {e}"));
            return;
        }
    };
    let (a, b) = (ceph.mnt("A"), ceph.mnt("B"));
    let work = setup.work.path();
    let busybox = base_images(rig, bin);
    let yaml = opa_pod(rig, bin, &busybox, work);
    let replica = |i: usize, node: &Path| {
        let p = work.join(format!("opa-{i}.yaml"));
        let pod = yaml.replacen("  name: opa\n", &format!("  name: opa-{i}\n"), 1);
        fs::write(&p, claim_on(&pod, "opa-policies", node)).unwrap();
        p
    };
    // The claim's directory on the file system both clients mount, as a
    // driver with fsGroup support would leave it.
    fs_group(&a.join("opa-policies"));
    let replicas = [replica(0, &a), replica(1, &a), replica(2, &b)];
    let plays: Vec<Child> = replicas.iter().map(|p| rig.kube_play(p)).collect();
    for (i, c) in plays.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "opa-{i}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            rig.logs(&[&format!("opa-{i}-publish-policies")])
        );
    }
    for node in [&a, &b] {
        let shared = node.join("opa-policies");
        assert_eq!(
            listing(&shared.join("policies")),
            listing(&repo().join("examples/opa-bundle")),
            "the live bundle through {}",
            node.display()
        );
        let gens: Vec<_> = fs::read_dir(shared.join(".policies.packsync/gen"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(gens.len(), 1, "three replicas, one generation: {gens:?}");
    }
    for i in 0..3 {
        let c = format!("opa-{i}-opa");
        assert_eq!(rig.exit_code(&c), "0");
        assert_eq!(
            rig.ok("podman", &["logs", &c]),
            "loaded: ./authz/policy.rego ./roles/data.json",
            "{c}"
        );
    }
    // A replica restarted on either node leaves the same generation live.
    let live = fs::read_link(a.join("opa-policies/policies")).unwrap();
    for (i, p) in replicas.iter().enumerate() {
        rig.down(p);
        if i == 1 {
            continue;
        }
        let (code, err) = rig.play(p);
        assert_eq!(code, Some(0), "opa-{i} again: {err}");
        rig.down(p);
    }
    assert_eq!(
        fs::read_link(b.join("opa-policies/policies")).unwrap(),
        live
    );
    eprintln!(
        "containers: OPA on two ceph-fuse clients: three replicas at once, one generation, \
         seen whole from both mounts; restarts on either node keep it live"
    );
}

/// opa-bundles.yaml: three replicas start at once and sync one bundle into
/// one volume (exactly one generation, the bundle's tree, what each OPA
/// stand-in loads); two-images-slots.yaml: two pack images, one slot each,
/// both packs and the st2 image's system packs published, consumers start.
#[test]
fn the_opa_and_two_image_examples_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();
    let busybox = base_images(rig, bin);

    let yaml = opa_pod(rig, bin, &busybox, work);
    let replicas: Vec<PathBuf> = (0..3)
        .map(|i| {
            let p = work.join(format!("opa-{i}.yaml"));
            fs::write(
                &p,
                yaml.replacen("  name: opa\n", &format!("  name: opa-{i}\n"), 1),
            )
            .unwrap();
            p
        })
        .collect();
    // Made beforehand, as a claim is: three plays at once race to make it.
    rig.claim("opa-policies");
    let plays: Vec<Child> = replicas.iter().map(|p| rig.kube_play(p)).collect();
    for (i, c) in plays.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "opa-{i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shared = rig.volume("opa-policies");
    assert_eq!(
        listing(&shared.join("policies")),
        listing(&repo().join("examples/opa-bundle")),
        "the live bundle"
    );
    let gens: Vec<_> = fs::read_dir(shared.join(".policies.packsync/gen"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(gens.len(), 1, "three replicas, one generation: {gens:?}");
    for i in 0..3 {
        let c = format!("opa-{i}-opa");
        assert_eq!(rig.exit_code(&c), "0");
        assert_eq!(
            rig.ok("podman", &["logs", &c]),
            "loaded: ./authz/policy.rego ./roles/data.json",
            "{c}"
        );
    }

    // Two pack images, one slot each.
    for (image, pack) in [
        ("st2packs-hello:1.2.0", "hello_st2"),
        ("st2packs-ops:0.4.1", "examples_ops"),
    ] {
        let dir = image.split(':').next().unwrap();
        rig.build(
            &format!("localhost/{image}"),
            &busybox,
            &[
                (bin, "/usr/local/bin/packsync"),
                (
                    &repo().join("examples/packs").join(pack),
                    &format!("/opt/packs-image/{dir}/packs/{pack}"),
                ),
                (
                    &repo().join("examples/virtualenvs").join(pack),
                    &format!("/opt/packs-image/{dir}/virtualenvs/{pack}"),
                ),
            ],
            &[],
        );
    }
    // The st2 image ships its system packs where the volume is mounted.
    rig.build(
        "localhost/st2actionrunner-packsync:3.8",
        &busybox,
        &[
            (bin, "/usr/local/bin/packsync"),
            (
                &repo().join("examples/system-packs"),
                "/opt/stackstorm/packs",
            ),
        ],
        &["--label", "org.opencontainers.image.version=3.8.0"],
    );
    let images = image_map(&[
        (
            "registry.example.com/st2packs-hello:1.2.0",
            "localhost/st2packs-hello:1.2.0",
        ),
        (
            "registry.example.com/st2packs-ops:0.4.1",
            "localhost/st2packs-ops:0.4.1",
        ),
        (
            "registry.example.com/st2actionrunner-packsync:3.8",
            "localhost/st2actionrunner-packsync:3.8",
        ),
        (
            "stackstorm/st2api:3.8",
            "localhost/st2actionrunner-packsync:3.8",
        ),
    ]);
    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/two-images-slots.yaml")).unwrap();
    let files: BTreeMap<String, PathBuf> = pods(&manifest, &images)
        .into_iter()
        .map(|(name, yaml)| {
            let p = work.join(format!("slots-{name}.yaml"));
            fs::write(&p, yaml).unwrap();
            (name, p)
        })
        .collect();
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["st2actionrunner", "st2api"],
        "the manifest's workloads"
    );
    for claim in ["st2-packs", "st2-virtualenvs"] {
        rig.claim(claim);
    }
    for name in ["st2api", "st2actionrunner"] {
        let (code, err) = rig.play(&files[name]);
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    assert_published(&rig.volume("st2-packs"), "examples/packs");
    assert_published(&rig.volume("st2-packs"), "examples/system-packs");
    assert_published(&rig.volume("st2-virtualenvs"), "examples/virtualenvs");
    assert_eq!(rig.exit_code("st2actionrunner-st2actionrunner"), "0");
    eprintln!(
        "containers: OPA example: 3 replicas at once, one generation, each OPA loaded the bundle; \
         two-images example: both slots and the system packs published, consumer started"
    );
}

/// stackstorm-from-registry.yaml: the publisher Job is the packsync image
/// alone, reading the st2 image's system packs and the pack image's packs
/// and virtualenvs from a registry (the rig's, holding the images this test
/// builds), each image verified against the cosign key of a Secret and
/// labelled by its `org.opencontainers.image.version`. Its pod is played on
/// the host's network to reach that registry (the rig's other pods have
/// none), `registry.example.com` in its `oci://` references becomes the
/// rig's registry, and the Secret's volume a directory holding the public
/// key (`secret_as_host_path`). Checked: every tree published in its slot,
/// `status` naming the image digest, the key's fingerprint and the image's
/// version; a re-run up to date; the next version's Job refused (exit 6,
/// nothing changed) while its image is unsigned, and once it is signed
/// removing the action that version dropped.
#[test]
fn the_stackstorm_registry_example_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();
    stackstorm_images(rig, bin, work);
    let registry = rig.var("CONTAINER_RIG_REGISTRY").to_string();
    for (local, remote) in [
        ("st2actionrunner-packsync:3.8", "st2actionrunner:3.8"),
        ("st2packs-example:1.2.0", "st2packs-example:1.2.0"),
        ("st2packs-example:1.3.0", "st2packs-example:1.3.0"),
    ] {
        rig.ok(
            "skopeo",
            &[
                "copy",
                "-q",
                "--dest-tls-verify=false",
                &format!("containers-storage:localhost/{local}"),
                &format!("docker://{registry}/{remote}"),
            ],
        );
    }
    let keys = work.join("keys");
    fs::create_dir_all(keys.join("secret")).unwrap();
    crate::trust_bundles::keypair(
        &keys,
        "cosign",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    fs::copy(keys.join("cosign.pub"), keys.join("secret/cosign.pub")).unwrap();
    let fingerprint = crate::trust_bundles::openssl_fingerprint(&keys, "cosign");
    let sign = |image: &str| cosign_sign(rig, work, &keys.join("cosign.key"), &registry, image);
    sign("st2actionrunner:3.8");
    sign("st2packs-example:1.2.0");
    let images = image_map(&[(
        "registry.example.com/packsync-image:0.1.0",
        "localhost/packsync-image:test",
    )]);
    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/stackstorm-from-registry.yaml"))
            .unwrap();
    let job = |version: &str| -> PathBuf {
        let text = manifest
            .replace("1.2.0", version)
            .replace("1-2-0", &version.replace('.', "-"));
        let all = pods(&text, &images);
        assert_eq!(all.len(), 1, "one Job");
        let (name, yaml) = &all[0];
        let yaml = yaml.replace("oci://registry.example.com/", &format!("oci://{registry}/"));
        let yaml = secret_as_host_path(&yaml, "packsync-cosign-key", &keys.join("secret"));
        let p = work.join(format!("{name}.yaml"));
        fs::write(&p, yaml).unwrap();
        p
    };
    for claim in ["st2-packs", "st2-virtualenvs"] {
        rig.claim(claim);
    }
    // Play one version's Job: kube play's exit code, its stderr and the
    // steps' logs; the pod is removed again.
    let play = |version: &str| -> (Option<i32>, String) {
        let pod = job(version);
        let name = format!("st2-publish-packs-{}", version.replace('.', "-"));
        let out = rig.kube_play_on(&pod, "host").wait_with_output().unwrap();
        let steps = ["system-packs", "virtualenvs", "packs"].map(|s| format!("{name}-{s}"));
        let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
        let code = out.status.code();
        if code == Some(0) {
            // The last step is the pod's container: done when it exits.
            assert_eq!(rig.exit_code(steps[2]), "0", "{}", rig.logs(&steps));
        }
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            rig.logs(&steps)
        );
        rig.down(&pod);
        (code, said)
    };
    let publish = |version: &str| -> String {
        let (code, said) = play(version);
        assert_eq!(code, Some(0), "{version}: {said}");
        said
    };

    let first = publish("1.2.0");
    assert!(first.contains(" synced: "), "{first}");
    let packs = rig.volume("st2-packs");
    let venvs = rig.volume("st2-virtualenvs");
    assert_published(&packs, "examples/packs");
    assert_published(&packs, "examples/system-packs");
    assert_published(&venvs, "examples/virtualenvs");
    let status = |slot: &str| -> serde_json::Value {
        let out = crate::fixture::packsync()
            .arg("status")
            .arg(&packs)
            .args(["--slot", slot, "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let live = &status("packs")["live"];
    assert!(
        live["sources"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("oci://{registry}/st2packs-example@sha256:")),
        "{live}"
    );
    assert_eq!(live["label"], "1.2.0", "the image's version: {live}");
    assert_eq!(live["verified"][0]["key"], fingerprint.as_str(), "{live}");
    assert_eq!(status("system")["live"]["label"], "3.8.0");
    // The same tag again: one request, nothing fetched, nothing changed.
    let before = (listing(&packs), listing(&venvs));
    let again = publish("1.2.0");
    assert!(again.contains(" up to date: "), "{again}");
    assert_eq!((listing(&packs), listing(&venvs)), before);
    // The next version's image, pushed but not signed: its first step that
    // reads it is refused before a layer is fetched, and nothing changes.
    let (code, said) = play("1.3.0");
    assert_ne!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "packsync: error: oci://{registry}/st2packs-example:1.3.0//opt/packs-image/virtualenvs: no cosign signature"
        )),
        "{said}"
    );
    assert_eq!((listing(&packs), listing(&venvs)), before);
    // Signed: the next version's Job publishes it.
    sign("st2packs-example:1.3.0");
    let next = publish("1.3.0");
    assert!(next.contains(" synced: "), "{next}");
    let actions = packs.join("examples_ops/actions");
    assert!(actions.join("disk_usage.yaml").exists());
    assert!(
        !actions.join("load_average.yaml").exists(),
        "the dropped action is gone"
    );
    assert!(
        packs.join("core/pack.yaml").exists(),
        "the system packs stay"
    );
    assert_eq!(status("packs")["live"]["label"], "1.3.0");
    eprintln!(
        "containers: the registry example: a Job of the packsync image alone published the st2 \
         image's system packs and the pack image's packs and virtualenvs from the registry, \
         each verified by the Secret's cosign key and labelled by its version; a re-run was up \
         to date, the unsigned 1.3.0 was refused with nothing changed, the signed 1.3.0 removed \
         its dropped action"
    );
}

/// Sign `registry/image` (NAME:TAG) as `cosign sign --key KEY` does: the
/// simple-signing payload naming its manifest digest, under the tag
/// `sha256-HEX.sig` beside it (`trust_images::SIG_PY`, in an OCI layout in
/// `work`, pushed with skopeo).
fn cosign_sign(rig: &Rig, work: &Path, key: &Path, registry: &str, image: &str) {
    let digest = rig.ok(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            "--format",
            "{{.Digest}}",
            &format!("docker://{registry}/{image}"),
        ],
    );
    let layout = work.join("signatures");
    if !layout.exists() {
        fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
        fs::write(
            layout.join("oci-layout"),
            r#"{"imageLayoutVersion": "1.0.0"}"#,
        )
        .unwrap();
        fs::write(
            layout.join("index.json"),
            r#"{"schemaVersion": 2, "manifests": []}"#,
        )
        .unwrap();
    }
    let out = Command::new("python3")
        .args(["-c", crate::trust_images::SIG_PY])
        .arg(&layout)
        .args([&digest, &digest])
        .arg(key)
        .arg("ec")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tag = format!("{}.sig", digest.replace(':', "-"));
    let repo = image.split(':').next().unwrap();
    rig.ok(
        "skopeo",
        &[
            "copy",
            "-q",
            "--dest-tls-verify=false",
            &format!("oci:{}:{tag}", layout.display()),
            &format!("docker://{registry}/{repo}:{tag}"),
        ],
    );
}

/// A pod's Secret volume (`secret: secretName: NAME`) as a hostPath of
/// `dir`: podman 4.3's kube play mounts a Secret's values still base64
/// encoded (and panics on one without `optional`), so the test hands the
/// pod the key file the Secret would hold, read-only as the manifest mounts it.
fn secret_as_host_path(yaml: &str, name: &str, dir: &Path) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut found = false;
    while i < lines.len() {
        let l = lines[i];
        if l.trim() == "secret:"
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim() == format!("secretName: {name}"))
        {
            let pad = &l[..indent(l)];
            out.push(format!("{pad}hostPath:"));
            out.push(format!("{pad}  path: {}", dir.display()));
            out.push(format!("{pad}  type: Directory"));
            found = true;
            i += 2;
            continue;
        }
        out.push(l.to_string());
        i += 1;
    }
    assert!(found, "no Secret volume {name} in:\n{yaml}");
    out.join("\n") + "\n"
}

/// opa-bundles-http.yaml: three replicas fetch one bundle from a bundle
/// server (python3's http.server, started here, stands in for it; the pods
/// are played on the host's network to reach it, and the manifest's
/// `https://bundles.example.com/` becomes its address) at once, and leave
/// one generation that every OPA stand-in loads. Then the server goes
/// away: a fourth replica starts on the last good bundle, its init
/// container exiting 0 with a line that says so, and the volume unchanged.
/// What the OPA stand-in loads from the signed bundle: its files and its signature.
const LOADED_SIGNED: &str = "loaded: ./.signatures.json ./authz/policy.rego ./roles/data.json";

#[test]
fn the_opa_http_example_keeps_the_last_good_bundle_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();
    let busybox = base_images(rig, bin);
    let _ = opa_pod(rig, bin, &busybox, work);
    rig.build(
        "localhost/packsync-busybox:1.36",
        &busybox,
        &[(bin, "/usr/local/bin/packsync")],
        &[],
    );
    // The bundle, signed as `opa build --signing-key` signs it, and the
    // public key where the Secret's volume would put it.
    let keys = work.join("keys");
    fs::create_dir_all(keys.join("secret")).unwrap();
    crate::trust_bundles::keypair(&keys, "bundle", &["-algorithm", "ed25519"]);
    fs::copy(keys.join("bundle.pub"), keys.join("secret/bundle.pub")).unwrap();
    let bundle = work.join("bundle");
    copy_tree(&repo().join("examples/opa-bundle"), &bundle);
    crate::trust_bundles::sign(&bundle, &keys.join("bundle.key"), "EdDSA", "", "{}");
    // The bundle server.
    let site = work.join("site/authz");
    fs::create_dir_all(&site).unwrap();
    let serve = || {
        let tar = Command::new("tar")
            .arg("-czf")
            .arg(site.join("bundle.tar.gz"))
            .arg("-C")
            .arg(&bundle)
            .arg(".")
            .status()
            .unwrap();
        assert!(tar.success());
    };
    serve();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let server = crate::source_oci::Helper(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(work.join("site"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    crate::source_oci::wait_for(20, "the bundle server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    let images = image_map(&[
        (
            "registry.example.com/packsync-busybox:1.36",
            "localhost/packsync-busybox:1.36",
        ),
        ("openpolicyagent/opa:1.4.2", "localhost/opa-standin:1"),
    ]);
    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/opa-bundles-http.yaml")).unwrap();
    let all = pods(&manifest, &images);
    assert_eq!(all.len(), 1, "one Deployment");
    let yaml = all[0].1.replace(
        "https://bundles.example.com/",
        &format!("http://127.0.0.1:{port}/"),
    );
    let yaml = secret_as_host_path(&yaml, "opa-bundle-key", &keys.join("secret"));
    let replica = |i: usize| {
        let p = work.join(format!("opa-{i}.yaml"));
        // Init containers kept after they ran, for their logs (podman
        // removes them otherwise).
        let keep = format!(
            "  name: opa-{i}\n  annotations:\n    io.podman.annotations.init.container.type: always\n"
        );
        fs::write(&p, yaml.replacen("  name: opa\n", &keep, 1)).unwrap();
        p
    };
    // Made beforehand, as a claim is: three plays at once race to make it.
    rig.claim("opa-policies");
    let plays: Vec<Child> = (0..3)
        .map(|i| rig.kube_play_on(&replica(i), "host"))
        .collect();
    for (i, c) in plays.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "opa-{i}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            rig.logs(&[&format!("opa-{i}-fetch-policies")])
        );
    }
    let shared = rig.volume("opa-policies");
    assert_eq!(
        listing(&shared.join("policies")),
        listing(&bundle),
        "the live bundle, its signature with it"
    );
    let gens = || {
        fs::read_dir(shared.join(".policies.packsync/gen"))
            .unwrap()
            .count()
    };
    assert_eq!(gens(), 1, "three replicas, one generation");
    for i in 0..3 {
        let c = format!("opa-{i}-opa");
        assert_eq!(rig.exit_code(&c), "0");
        assert_eq!(rig.ok("podman", &["logs", &c]), LOADED_SIGNED, "{c}");
    }

    // A replica that cannot publish a new bundle starts on the last good
    // one: its init container's lines (stdout and stderr, so in no fixed
    // order): the failure, the live bundle, and what the pod does about it.
    let before = listing(&shared);
    let starts_on_the_last_good = |i: usize| -> String {
        let out = rig
            .kube_play_on(&replica(i), "host")
            .wait_with_output()
            .unwrap();
        let log = rig
            .tool("podman")
            .args(["logs", &format!("opa-{i}-fetch-policies")])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&[log.stdout, log.stderr].concat()).into_owned();
        assert!(
            out.status.success(),
            "opa-{i}: {}{log}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        let failed = format!("packsync: error: http://127.0.0.1:{port}/authz/bundle.tar.gz: ");
        let said = |what: &dyn Fn(&str) -> bool| lines.iter().filter(|l| what(l)).count() == 1;
        assert!(
            said(
                &|l| l.starts_with("packsync: /shared/policies: generation ")
                    && l.ends_with(" is live")
            ),
            "{log}"
        );
        assert!(said(&|l| l.starts_with(&failed)), "{log}");
        assert!(
            said(&|l| l == "no new bundle could be published: starting on the last good bundle"),
            "{log}"
        );
        let opa = format!("opa-{i}-opa");
        assert_eq!(rig.exit_code(&opa), "0");
        assert_eq!(rig.ok("podman", &["logs", &opa]), LOADED_SIGNED);
        assert_eq!(listing(&shared), before, "the volume is unchanged");
        let failure = lines.iter().find(|l| l.starts_with(&failed)).unwrap();
        failure.to_string()
    };
    // The server now serves the bundle with its policy changed after signing.
    let policy = bundle.join("authz/policy.rego");
    let text = fs::read_to_string(&policy).unwrap();
    fs::write(&policy, text + "\n# changed after signing\n").unwrap();
    serve();
    let altered = starts_on_the_last_good(3);
    assert!(
        altered.ends_with(": /authz/policy.rego: hash mismatch")
            || altered.contains(": /authz/policy.rego: hash mismatch ("),
        "{altered}"
    );
    // The bundle server goes away.
    drop(server);
    let down = starts_on_the_last_good(4);
    eprintln!(
        "containers: OPA over HTTP: three replicas at once verified the bundle's signature and \
         left one generation; a bundle altered after signing and then the server gone each \
         left a replica starting on the last good bundle: {altered} / {down}"
    );
}

/// A stand-in for git-sync, `localhost/git-sync-standin:1`: it reads
/// `--root` and `--link`, makes the first checkout the way git-sync lays
/// one out (`ROOT/rev-1`, `ROOT/LINK -> rev-1`) holding the repository
/// directory `from` as `name`, and stays, as the sidecar does.
fn git_sync_standin(rig: &Rig, busybox: &str, work: &Path, from: &str, name: &str) {
    let gitsync = work.join("git-sync");
    fs::write(
        &gitsync,
        "#!/bin/sh\nset -e\nfor a; do case $a in --root=*) root=${a#--root=};; --link=*) link=${a#--link=};; esac; done\n\
         mkdir -p \"$root/rev-1\" && cp -a /seed/. \"$root/rev-1/\" && ln -sfn rev-1 \"$root/$link\"\n\
         exec sleep 2147483647\n",
    )
    .unwrap();
    fs::set_permissions(
        &gitsync,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let seed = work.join("seed");
    copy_tree(&repo().join(from), &seed.join(name));
    rig.build(
        "localhost/git-sync-standin:1",
        busybox,
        &[(&gitsync, "/bin/git-sync"), (&seed, "/seed")],
        &["--entrypoint", r#"["/bin/git-sync"]"#],
    );
}

/// git-sync's next round in the checkout volume `git`: `rev-2`, a copy of
/// `rev-1` changed by `edit`, then `current` swapped to it by one rename.
fn git_sync_round(git: &Path, edit: impl FnOnce(&Path)) {
    let rev2 = git.join("rev-2");
    copy_tree(&git.join("rev-1"), &rev2);
    edit(&rev2);
    std::os::unix::fs::symlink("rev-2", git.join("current.new")).unwrap();
    fs::rename(git.join("current.new"), git.join("current")).unwrap();
}

/// stackstorm-publisher.yaml: a publisher Deployment whose packsync loop
/// (`sync --every`) follows a git checkout. git-sync, a native sidecar, runs
/// as an ordinary container (`sidecars_as_containers`); its stand-in makes
/// the first checkout the way git-sync lays one out (`/git/current ->
/// rev-1`) and stays; the loop, whose first rounds may find no checkout
/// yet and back off, publishes it into the packs slot. The test then plays git-sync's next
/// round itself (a new revision beside the old, `current` swapped by one
/// rename), sends SIGHUP (a round at once, rather than in 30 s) and sees the
/// volume follow; SIGTERM then stops the loop with 143 and no staging left.
#[test]
fn the_stackstorm_publisher_example_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();
    stackstorm_images(rig, bin, work);
    let busybox = rig.var("CONTAINER_RIG_BUSYBOX_IMAGE").to_string();
    git_sync_standin(rig, &busybox, work, "examples/packs", "packs");
    let images = image_map(&[
        (
            "registry.example.com/git-sync:v4.4.0",
            "localhost/git-sync-standin:1",
        ),
        (
            "registry.example.com/st2packs-example:1.2.0",
            "localhost/st2packs-example:1.2.0",
        ),
    ]);
    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/stackstorm-publisher.yaml")).unwrap();
    let all = pods(&manifest, &images);
    assert_eq!(all.len(), 1, "one Deployment");
    let pod = work.join("publisher.yaml");
    fs::write(&pod, &all[0].1).unwrap();
    rig.claim("st2-packs");
    let (code, err) = rig.play(&pod);
    assert_eq!(code, Some(0), "publisher: {err}");
    let publisher = "st2-packs-publisher-publish-packs";
    let packs = rig.volume("st2-packs");
    let logs = [publisher];
    let until = |what: &str, cond: &dyn Fn() -> bool| rig.until(&logs, what, cond);
    until("the first round never published", &|| {
        packs
            .join("examples_ops/actions/load_average.yaml")
            .exists()
    });
    assert_published(&packs, "examples/packs");

    // git-sync's next round: a new revision, `current` swapped in one rename.
    git_sync_round(&rig.volume("git"), |rev| {
        for f in ["load_average.py", "load_average.yaml"] {
            fs::remove_file(rev.join("packs/examples_ops/actions").join(f)).unwrap();
        }
    });
    rig.ok("podman", &["kill", "--signal", "HUP", publisher]);
    until("SIGHUP did not publish the new revision", &|| {
        !packs
            .join("examples_ops/actions/load_average.yaml")
            .exists()
    });
    assert!(packs.join("examples_ops/actions/disk_usage.yaml").exists());
    assert!(packs.join("hello_st2/pack.yaml").exists());

    // The kubelet's SIGTERM: the loop ends with 143, leaving no staging.
    rig.ok("podman", &["stop", "-t", "20", publisher]);
    assert_eq!(
        rig.exit_code(publisher),
        "143",
        "{}",
        rig.logs(&[publisher])
    );
    let stage = packs.join("..packsync/slots/packs/stage");
    let left: Vec<_> = fs::read_dir(&stage)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging left: {left:?}");
    rig.down(&pod);
    eprintln!(
        "containers: the publisher example: the loop published the checkout, followed a new \
         revision on SIGHUP, and stopped with 143 on SIGTERM, no staging left"
    );
}

/// opa-bundles-sidecar.yaml: git-sync and the packsync loop are native
/// sidecars beside OPA, run here as ordinary containers
/// (`sidecars_as_containers`), with the git-sync stand-in of the publisher
/// test. The OPA stand-in waits for the bundle (the startup probe's job,
/// which podman ignores), prints what it loads, and, as `--watch` would,
/// loads again when /shared/policies moves to a new generation. The test
/// plays git-sync's next round (a changed policy), sends SIGHUP, and sees
/// OPA load the new policy; SIGTERM stops the loop with 143.
#[test]
fn the_opa_sidecar_example_in_real_containers() {
    let Some(setup) = setup() else { return };
    let (rig, bin) = (&setup.rig, &setup.bin);
    let work = setup.work.path();
    let busybox = base_images(rig, bin);
    rig.build(
        "localhost/packsync-busybox:1.36",
        &busybox,
        &[(bin, "/usr/local/bin/packsync")],
        &[],
    );
    git_sync_standin(rig, &busybox, work, "examples/opa-bundle", "opa-bundle");
    let opa = work.join("opa");
    fs::write(
        &opa,
        "#!/bin/sh\nfor a; do dir=$a; done\n\
         load() { echo \"loaded: $(cd \"$dir\" && find . -type f | sort | xargs cat | md5sum | cut -c1-8)\"; }\n\
         until [ -e \"$dir/authz/policy.rego\" ]; do sleep 0.1; done\n\
         was=$(readlink \"$dir\"); load\n\
         while [ \"$(readlink \"$dir\")\" = \"$was\" ]; do sleep 0.1; done\n\
         load\n",
    )
    .unwrap();
    fs::set_permissions(&opa, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    rig.build(
        "localhost/opa-watch-standin:1",
        &busybox,
        &[(&opa, "/bin/opa")],
        &["--entrypoint", r#"["/bin/opa"]"#],
    );
    let images = image_map(&[
        (
            "registry.example.com/git-sync:v4.4.0",
            "localhost/git-sync-standin:1",
        ),
        (
            "registry.example.com/packsync-busybox:1.36",
            "localhost/packsync-busybox:1.36",
        ),
        ("openpolicyagent/opa:1.4.2", "localhost/opa-watch-standin:1"),
    ]);
    let manifest =
        fs::read_to_string(repo().join("examples/kubernetes/opa-bundles-sidecar.yaml")).unwrap();
    let all = pods(&manifest, &images);
    assert_eq!(all.len(), 1, "one Deployment");
    let pod = work.join("opa-sidecar.yaml");
    fs::write(&pod, &all[0].1).unwrap();
    rig.claim("opa-policies");
    let (code, err) = rig.play(&pod);
    assert_eq!(code, Some(0), "opa: {err}");
    let (keep, opa_c) = ("opa-keep-policies", "opa-opa");
    let digest = |dir: &Path| {
        let out = Command::new("sh")
            .arg("-c")
            .arg("find . -type f | sort | xargs cat | md5sum | cut -c1-8")
            .current_dir(dir)
            .output()
            .unwrap();
        format!("loaded: {}", String::from_utf8_lossy(&out.stdout).trim())
    };
    let logs = [keep, opa_c];
    let until = |what: &str, cond: &dyn Fn() -> bool| rig.until(&logs, what, cond);
    let opa_log = || {
        rig.tool("podman")
            .args(["logs", opa_c])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let v1 = digest(&repo().join("examples/opa-bundle"));
    until("OPA never loaded the first bundle", &|| {
        opa_log().lines().count() == 1
    });
    assert_eq!(opa_log().trim(), v1);
    let shared = rig.volume("opa-policies");
    assert_eq!(
        listing(&shared.join("policies")),
        listing(&repo().join("examples/opa-bundle"))
    );

    // git-sync's next round: the policy changes; SIGHUP instead of 30 s.
    let git = rig.volume("git");
    git_sync_round(&git, |rev| {
        let rego = rev.join("opa-bundle/authz/policy.rego");
        let text = fs::read_to_string(&rego).unwrap();
        fs::write(&rego, format!("{text}\n# revision 2\n")).unwrap();
    });
    let rev2 = git.join("rev-2");
    rig.ok("podman", &["kill", "--signal", "HUP", keep]);
    until("OPA never loaded the new bundle", &|| {
        opa_log().lines().count() == 2
    });
    let v2 = digest(&rev2.join("opa-bundle"));
    assert_ne!(v1, v2);
    assert_eq!(opa_log().lines().nth(1), Some(v2.as_str()));
    assert_eq!(rig.exit_code(opa_c), "0");
    rig.ok("podman", &["stop", "-t", "20", keep]);
    assert_eq!(rig.exit_code(keep), "143", "{}", rig.logs(&[keep]));
    rig.down(&pod);
    eprintln!(
        "containers: the OPA sidecar example: OPA loaded the bundle the loop published, and the \
         next revision after SIGHUP; the loop stopped with 143"
    );
}
