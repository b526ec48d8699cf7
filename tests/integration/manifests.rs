//! The Kubernetes examples as a cluster's admission would read them: every
//! pod of every manifest in examples/kubernetes/ passes the Pod Security
//! Standards "restricted" profile, with a fixed non-root UID, an fsGroup and
//! a read-only root filesystem; and the README and docs/ link only to files
//! and headings that exist in the repository.
//!
//! The manifests are parsed by a real YAML parser (Python's PyYAML, Debian's
//! `python3-yaml`: no YAML crate is a dependency), which turns them into
//! JSON for serde_json; the checks are made here, on that structure.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every YAML document of `files`, as JSON: `[[file, document], ...]`.
const TO_JSON: &str = r#"
import json, sys, yaml
out = []
for path in sys.argv[1:]:
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is not None:
                out.append([path, doc])
json.dump(out, sys.stdout)
"#;

/// The manifests' documents, or `None` (after a skip line) without PyYAML.
fn documents() -> Option<Vec<(String, Value)>> {
    let dir = repo().join("examples/kubernetes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let out = match Command::new("python3")
        .arg("-c")
        .arg(TO_JSON)
        .args(&files)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            crate::fixture::skip(&format!("manifests: python3: {e}"));
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("No module named 'yaml'") {
        crate::fixture::skip("manifests: python3 has no yaml module (Debian: python3-yaml)");
        return None;
    }
    assert!(out.status.success(), "the manifests do not parse: {stderr}");
    let docs: Vec<(String, Value)> = serde_json::from_slice(&out.stdout).unwrap();
    Some(
        docs.into_iter()
            .map(|(p, d)| {
                let name = Path::new(&p).file_name().unwrap().to_string_lossy().into();
                (name, d)
            })
            .collect(),
    )
}

/// The pod spec of a workload document, and what the document is called.
fn pod_spec(doc: &Value) -> Option<(String, &Value)> {
    let kind = doc["kind"].as_str()?;
    let spec = match kind {
        "Pod" => &doc["spec"],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            &doc["spec"]["template"]["spec"]
        }
        "CronJob" => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => return None,
    };
    let name = doc["metadata"]["name"].as_str().unwrap_or("?");
    Some((format!("{kind} {name}"), spec))
}

/// A container's setting, or the pod's where the container leaves it out.
fn effective<'a>(pod: &'a Value, ctr: &'a Value, key: &str) -> &'a Value {
    match &ctr["securityContext"][key] {
        Value::Null => &pod["securityContext"][key],
        v => v,
    }
}

/// What in one pod spec breaks the "restricted" profile or the examples'
/// rules (a fixed non-root UID, an fsGroup, a read-only root filesystem).
fn violations(spec: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let psc = &spec["securityContext"];
    if matches!(psc["fsGroup"].as_u64(), None | Some(0)) {
        bad.push("pod: securityContext.fsGroup is not set to a non-root group".into());
    }
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[host] == Value::Bool(true) {
            bad.push(format!("pod: {host}: true"));
        }
    }
    const VOLUMES: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("?");
        for key in v.as_object().into_iter().flat_map(|o| o.keys()) {
            if key != "name" && !VOLUMES.contains(&key.as_str()) {
                bad.push(format!("volume {name}: {key} is not allowed"));
            }
        }
    }
    let containers = ["initContainers", "containers"].iter().flat_map(|k| {
        spec[*k]
            .as_array()
            .into_iter()
            .flatten()
            .map(move |c| (*k, c))
    });
    let mut any = false;
    for (list, c) in containers {
        any = true;
        let name = format!("{list} {}", c["name"].as_str().unwrap_or("?"));
        let sc = &c["securityContext"];
        if effective(spec, c, "runAsNonRoot") != &Value::Bool(true) {
            bad.push(format!("{name}: runAsNonRoot is not true"));
        }
        if matches!(effective(spec, c, "runAsUser").as_u64(), None | Some(0)) {
            bad.push(format!("{name}: runAsUser is not a fixed non-root UID"));
        }
        if effective(spec, c, "seccompProfile")["type"] != "RuntimeDefault" {
            bad.push(format!("{name}: seccompProfile.type is not RuntimeDefault"));
        }
        if sc["allowPrivilegeEscalation"] != Value::Bool(false) {
            bad.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if sc["privileged"] == Value::Bool(true) {
            bad.push(format!("{name}: privileged"));
        }
        let drop: Vec<&str> = sc["capabilities"]["drop"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !drop.contains(&"ALL") {
            bad.push(format!("{name}: capabilities.drop lacks ALL"));
        }
        for add in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if add != "NET_BIND_SERVICE" {
                bad.push(format!("{name}: capabilities.add {add}"));
            }
        }
        if sc["readOnlyRootFilesystem"] != Value::Bool(true) {
            bad.push(format!("{name}: readOnlyRootFilesystem is not true"));
        }
    }
    if !any {
        bad.push("pod: no containers".into());
    }
    bad
}

#[test]
fn every_example_pod_passes_the_restricted_pod_security_standard() {
    let Some(docs) = documents() else { return };
    let mut failures = Vec::new();
    let mut pods = BTreeSet::new();
    for (file, doc) in &docs {
        let Some((what, spec)) = pod_spec(doc) else {
            continue;
        };
        pods.insert(file.clone());
        for v in violations(spec) {
            failures.push(format!("{file}: {what}: {v}"));
        }
    }
    // Every manifest holds at least one workload, so none is left unchecked.
    let files: BTreeSet<&String> = docs.iter().map(|(f, _)| f).collect();
    for f in files {
        if !pods.contains(f) {
            failures.push(format!("{f}: no Deployment, Job or Pod found"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_restricted_check_finds_what_a_cluster_would_refuse() {
    let good: Value = serde_json::json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "a", "securityContext": {
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "tmp", "emptyDir": {}}]
    });
    assert_eq!(violations(&good), Vec::<String>::new());
    // A container overriding the pod's user with root, a hostPath, no drop.
    let mut bad = good.clone();
    bad["containers"][0]["securityContext"]["runAsUser"] = 0.into();
    bad["containers"][0]["securityContext"]["capabilities"] =
        serde_json::json!({"add": ["SYS_ADMIN"]});
    bad["volumes"][0] = serde_json::json!({"name": "h", "hostPath": {"path": "/"}});
    bad["securityContext"]
        .as_object_mut()
        .unwrap()
        .remove("fsGroup");
    assert_eq!(
        violations(&bad),
        [
            "pod: securityContext.fsGroup is not set to a non-root group",
            "volume h: hostPath is not allowed",
            "containers a: runAsUser is not a fixed non-root UID",
            "containers a: capabilities.drop lacks ALL",
            "containers a: capabilities.add \"SYS_ADMIN\"",
        ]
    );
}

/// The Markdown files a user reads: the README, docs/ and the examples' READMEs.
fn markdown() -> Vec<PathBuf> {
    let mut files = vec![
        repo().join("README.md"),
        repo().join("examples/README.md"),
        repo().join("examples/kubernetes/README.md"),
    ];
    let mut docs: Vec<PathBuf> = fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// A heading's anchor as GitHub makes it: lower case, punctuation other
/// than `-` and `_` dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut code = false;
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            code = !code;
        } else if !code && l.starts_with('#') {
            let a = anchor(l.trim_start_matches('#'));
            // GitHub numbers a repeated heading: a, a-1, a-2...
            let mut name = a.clone();
            let mut n = 0;
            while !out.insert(name.clone()) {
                n += 1;
                name = format!("{a}-{n}");
            }
        }
    }
    out
}

/// The `](target)` links of a Markdown text, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut code = false;
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if code {
            continue;
        }
        let mut rest = l;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn the_readme_and_docs_link_to_files_and_headings_that_exist() {
    let mut failures = Vec::new();
    for file in markdown() {
        let text = fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(repo()).unwrap().display().to_string();
        for bad in ["../shared", "/work/", "SPEC.md"] {
            if text.contains(bad) {
                failures.push(format!(
                    "{rel}: names {bad}, which is not in the repository"
                ));
            }
        }
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                failures.push(format!("{rel}: link {link}: no file {}", target.display()));
                continue;
            }
            if !frag.is_empty() {
                let ok = target.is_file()
                    && anchors(&fs::read_to_string(&target).unwrap()).contains(frag);
                if !ok {
                    failures.push(format!("{rel}: link {link}: no heading #{frag} there"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn headings_become_the_anchors_github_gives_them() {
    assert_eq!(anchor(" Exit codes"), "exit-codes");
    assert_eq!(
        anchor(" `--slot NAME`: several images, one volume"),
        "--slot-name-several-images-one-volume"
    );
    assert_eq!(
        anchor(" Sources: what is and is not read"),
        "sources-what-is-and-is-not-read"
    );
    let a = anchors("# A\n```\n# not\n```\n## A\n");
    assert_eq!(a, ["a".to_string(), "a-1".to_string()].into());
    assert_eq!(
        links("see [x](docs/a.md#b) and [y](#c)\n```\n[z](no)\n```\n"),
        ["docs/a.md#b", "#c"]
    );
}
