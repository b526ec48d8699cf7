//! The documents of an image: an image index (OCI, or a Docker manifest
//! list) and an image manifest (OCI, or Docker schema 2), parsed from bytes
//! a registry or a layout directory handed over, checked (digests, sizes,
//! media types, counts) before anything is fetched by what they say; and
//! the choice of a platform from an index. Pure; fuzzed
//! (`fuzzing::oci_manifest`).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::oci_ref::valid_digest;
use super::store::{DescPlatform, Descriptor};
use crate::config::Platform;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The `Accept` of a manifest request: every kind read here.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// The tag annotation of an OCI layout's index.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// More layers than any real image has; more manifests than any index.
const MAX_LAYERS: usize = 512;
const MAX_MANIFESTS: usize = 1024;
/// A layer or blob larger than this is refused before it is fetched.
pub const MAX_BLOB: u64 = 1 << 40;

impl DescPlatform {
    fn shown(&self) -> String {
        match &self.variant {
            Some(v) if !v.is_empty() => format!("{}/{}/{v}", self.os, self.architecture),
            _ => format!("{}/{}", self.os, self.architecture),
        }
    }
}

/// A parsed document: an index to choose from, or an image.
#[derive(Debug, PartialEq, Eq)]
pub enum Document {
    Index(Vec<Descriptor>),
    Image(Vec<Descriptor>),
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<u32>,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    manifests: Option<Vec<Descriptor>>,
    layers: Option<Vec<Descriptor>>,
    config: Option<Descriptor>,
}

/// The annotation (and config label) `--label auto` takes an image's version from.
pub const VERSION: &str = "org.opencontainers.image.version";

/// The longest version `--label auto` takes from an image.
const MAX_VERSION: usize = 256;

fn usable(v: &str) -> Option<String> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= MAX_VERSION && !v.chars().any(char::is_control))
        .then(|| v.to_string())
}

/// An image manifest's `org.opencontainers.image.version` annotation.
pub fn version_annotation(manifest: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct M {
        annotations: Option<BTreeMap<String, String>>,
    }
    let m: M = serde_json::from_slice(manifest).ok()?;
    usable(m.annotations?.get(VERSION)?)
}

/// An image manifest's config descriptor, checked as layers are.
pub fn config_of(manifest: &[u8]) -> Option<Descriptor> {
    let raw: Raw = serde_json::from_slice(manifest).ok()?;
    raw.config
        .filter(|c| valid_digest(&c.digest) && c.size <= crate::net::MAX_DOCUMENT)
}

/// An image config's `config.Labels["org.opencontainers.image.version"]`.
pub fn version_label(config: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct C {
        config: Option<Inner>,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(rename = "Labels")]
        labels: Option<BTreeMap<String, String>>,
    }
    let c: C = serde_json::from_slice(config).ok()?;
    usable(c.config?.labels?.get(VERSION)?)
}

/// Parse a manifest or an index; `content_type` is what the server said
/// (a layout has none). Every descriptor's digest is `sha256:<hex>`; which
/// layers can be published, and how, is `oci_artifact::plan`'s to say.
pub fn parse(data: &[u8], content_type: Option<&str>) -> Result<Document> {
    let raw: Raw = serde_json::from_slice(data)
        .map_err(|e| anyhow::anyhow!("not an image manifest or index: {e}"))?;
    if raw.schema_version == Some(1) {
        bail!("Docker schema 1 manifests are not supported (schemaVersion 1)");
    }
    if raw.schema_version != Some(2) {
        bail!(
            "unsupported manifest schemaVersion {} (only 2)",
            raw.schema_version
                .map_or("missing".into(), |v| v.to_string())
        );
    }
    let declared = raw
        .media_type
        .as_deref()
        .or(content_type.map(|c| c.split(';').next().unwrap_or("").trim()))
        .unwrap_or("");
    let check = |d: &Descriptor| -> Result<()> {
        if !valid_digest(&d.digest) {
            bail!("{:?} is not a sha256 digest", d.digest);
        }
        if d.size > MAX_BLOB {
            bail!("a blob of {} bytes is refused", d.size);
        }
        Ok(())
    };
    match (raw.manifests, raw.layers) {
        (Some(ms), None) => {
            if !matches!(declared, "" | OCI_INDEX | DOCKER_LIST) {
                bail!("a list of manifests declared as {declared:?}");
            }
            if ms.len() > MAX_MANIFESTS {
                bail!("an index of {} manifests is refused", ms.len());
            }
            for m in &ms {
                check(m)?;
            }
            Ok(Document::Index(ms))
        }
        (None, Some(layers)) => {
            if !matches!(declared, "" | OCI_MANIFEST | DOCKER_MANIFEST) {
                bail!("an image manifest declared as {declared:?}");
            }
            if raw.config.is_none() {
                bail!("an image manifest without config");
            }
            if layers.len() > MAX_LAYERS {
                bail!("an image of {} layers is refused", layers.len());
            }
            for l in &layers {
                check(l)?;
            }
            Ok(Document::Image(layers))
        }
        (Some(_), Some(_)) => bail!("a document with both manifests and layers"),
        (None, None)
            if raw.config.is_some() || matches!(declared, OCI_MANIFEST | DOCKER_MANIFEST) =>
        {
            bail!("an image manifest without layers")
        }
        (None, None) => bail!("neither an image manifest nor an index"),
    }
}

/// An image manifest's `org.opencontainers.image.created` annotation, as
/// seconds since the epoch (RFC 3339; None where absent or malformed).
pub fn created_annotation(manifest: &[u8]) -> Option<i64> {
    #[derive(Deserialize)]
    struct M {
        annotations: Option<BTreeMap<String, String>>,
    }
    let m: M = serde_json::from_slice(manifest).ok()?;
    let text = m.annotations?.get(CREATED)?.clone();
    rfc3339_seconds(text.trim())
}

/// The annotation `oras push` gives each file's layer: its name.
pub const TITLE: &str = "org.opencontainers.image.title";
/// `oras push DIR`: the layer is a tar(+gzip) of DIR, to unpack as DIR.
pub const UNPACK: &str = "io.deis.oras.content.unpack";
/// When the manifest says it was made: titled files get this mtime.
pub const CREATED: &str = "org.opencontainers.image.created";

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as seconds since the epoch.
fn rfc3339_seconds(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        (s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = &t[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let oh: i64 = o[1..3].parse().ok()?;
            let om: i64 = o[4..6].parse().ok()?;
            let v = oh * 3600 + om * 60;
            if &o[..1] == "-" {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + s - offset)
}

/// tar, tar+gzip, tar+zstd layers (OCI, Docker schema 2); the stream itself
/// says which compression it has.
pub fn is_layer_type(t: &str) -> bool {
    matches!(
        t,
        "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.diff.tar"
    )
}

/// The platform this binary runs on, as image indexes name it.
pub fn running_platform() -> Platform {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    };
    Platform {
        os: std::env::consts::OS.to_string(),
        arch: arch.to_string(),
        variant: None,
    }
}

/// An OS, an architecture and a variant as containerd's platform matcher
/// normalises them before comparing: lowercase; `x86_64` is `amd64` (whose
/// `v1` is no variant), `aarch64` is `arm64` (whose `v8` is no variant:
/// what `buildah manifest add` writes for `linux/arm64/v8`), `i386` is
/// `386`, `armhf` is `arm/v7`, `armel` is `arm/v6`, and `arm` without a
/// variant is `arm/v7`; a variant given as a bare number gets its `v`.
pub(crate) fn normalised(os: &str, arch: &str, variant: Option<&str>) -> (String, String, String) {
    let os = match os.to_ascii_lowercase().as_str() {
        "macos" => "darwin".to_string(),
        o => o.to_string(),
    };
    let arch = arch.to_ascii_lowercase();
    let variant = variant.unwrap_or("").to_ascii_lowercase();
    let (arch, variant) = match arch.as_str() {
        "i386" | "386" => ("386", String::new()),
        "x86_64" | "x86-64" | "amd64" => (
            "amd64",
            if variant == "v1" {
                String::new()
            } else {
                variant
            },
        ),
        "aarch64" | "arm64" => (
            "arm64",
            match variant.as_str() {
                "8" | "v8" | "v8.0" => String::new(),
                "9" | "9.0" | "v9.0" => "v9".to_string(),
                _ => variant,
            },
        ),
        "armhf" => ("arm", "v7".to_string()),
        "armel" => ("arm", "v6".to_string()),
        "arm" => (
            "arm",
            match variant.as_str() {
                "" | "7" => "v7".to_string(),
                "5" | "6" | "8" => format!("v{variant}"),
                _ => variant,
            },
        ),
        other => return (os, other.to_string(), variant),
    };
    (os, arch.to_string(), variant)
}

/// The manifest of `want` among an index's, compared as containerd
/// compares platforms (`normalised`): so `linux/arm64/v8` takes an entry
/// `linux/arm64` and the other way round, `linux/arm` takes `linux/arm/v7`.
/// A variant asked for must match; with none asked, the entry whose
/// variant is the normalised default (none; `v7` for `arm`), else the
/// first of that OS and architecture. Entries without a platform
/// (attestations) never match.
pub fn choose<'a>(manifests: &'a [Descriptor], want: &Platform) -> Result<&'a Descriptor> {
    let (os, arch, variant) = normalised(&want.os, &want.arch, want.variant.as_deref());
    let candidates: Vec<(&Descriptor, String)> = manifests
        .iter()
        .filter_map(|m| {
            let p = m.platform.as_ref()?;
            let (o, a, v) = normalised(&p.os, &p.architecture, p.variant.as_deref());
            (o == os && a == arch).then_some((m, v))
        })
        .collect();
    let exact = candidates.iter().find(|(_, v)| *v == variant);
    let chosen = match &want.variant {
        Some(_) => exact,
        None => exact.or(candidates.first()),
    }
    .map(|(m, _)| *m);
    match chosen {
        Some(m) => Ok(m),
        None => {
            let offered: Vec<String> = manifests
                .iter()
                .filter_map(|m| m.platform.as_ref().map(DescPlatform::shown))
                .filter(|p| p != "unknown/unknown")
                .collect();
            bail!(
                "no image for {want} in the index (it has {}; pick one with --platform)",
                if offered.is_empty() {
                    "none with a platform".to_string()
                } else {
                    offered.join(", ")
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn index() -> String {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"os":"linux","architecture":"amd64"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"os":"linux","architecture":"arm64","variant":"v8"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"os":"unknown","architecture":"unknown"}}}}]}}"#,
            d(1),
            d(2),
            d(3)
        )
    }

    #[test]
    fn an_index_and_its_platforms() {
        let Document::Index(ms) = parse(index().as_bytes(), None).unwrap() else {
            panic!("not an index");
        };
        let p = |s: &str| crate::config::parse_platform(s).unwrap();
        assert_eq!(choose(&ms, &p("linux/amd64")).unwrap().digest, d(1));
        assert_eq!(choose(&ms, &p("linux/arm64")).unwrap().digest, d(2));
        assert_eq!(choose(&ms, &p("linux/arm64/v8")).unwrap().digest, d(2));
        let e = choose(&ms, &p("linux/s390x")).unwrap_err().to_string();
        assert!(
            e.contains("no image for linux/s390x") && e.contains("linux/amd64, linux/arm64/v8"),
            "{e}"
        );
        assert!(choose(&ms, &p("linux/arm64/v7")).is_err());
    }

    /// An index of `(os, architecture, variant)` entries, digests d(1)...
    fn index_of(platforms: &[(&str, &str, Option<&str>)]) -> Vec<Descriptor> {
        let entries: Vec<String> = platforms
            .iter()
            .enumerate()
            .map(|(i, (os, arch, variant))| {
                let v = variant.map_or(String::new(), |v| format!(r#","variant":"{v}""#));
                format!(
                    r#"{{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"os":"{os}","architecture":"{arch}"{v}}}}}"#,
                    d(i as u8 + 1)
                )
            })
            .collect();
        let text = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{}]}}"#,
            entries.join(",")
        );
        match parse(text.as_bytes(), None).unwrap() {
            Document::Index(ms) => ms,
            other => panic!("not an index: {other:?}"),
        }
    }

    #[test]
    fn platforms_match_as_containerd_normalises_them() {
        let p = |s: &str| crate::config::parse_platform(s).unwrap();
        let pick = |ms: &[Descriptor], s: &str| choose(ms, &p(s)).map(|m| m.digest.clone());
        // What `buildah manifest add` writes: arm64 without a variant, and
        // 32-bit arm with one (v6 listed first).
        let buildah = index_of(&[
            ("linux", "amd64", None),
            ("linux", "arm64", None),
            ("linux", "arm", Some("v6")),
            ("linux", "arm", Some("v7")),
        ]);
        for (asked, want) in [
            ("linux/amd64", 1),
            ("linux/amd64/v1", 1),
            ("linux/x86_64", 1),
            ("linux/arm64", 2),
            ("linux/arm64/v8", 2),
            ("linux/aarch64", 2),
            ("linux/aarch64/8", 2),
            ("linux/arm", 4),
            ("linux/arm/v7", 4),
            ("linux/arm/7", 4),
            ("linux/armhf", 4),
            ("linux/arm/v6", 3),
            ("linux/armel", 3),
        ] {
            assert_eq!(pick(&buildah, asked).unwrap(), d(want), "{asked}");
        }
        for missing in [
            "linux/arm64/v9",
            "linux/arm/v5",
            "linux/amd64/v3",
            "windows/amd64",
        ] {
            let e = pick(&buildah, missing).unwrap_err().to_string();
            assert!(
                e.contains(&format!("no image for {missing} in the index")),
                "{e}"
            );
        }
        // The other way round: the index names arm64/v8 (Docker's manifest
        // lists), and `arm` without a variant, which is v7.
        let docker = index_of(&[("linux", "arm64", Some("v8")), ("linux", "arm", None)]);
        assert_eq!(pick(&docker, "linux/arm64").unwrap(), d(1));
        assert_eq!(pick(&docker, "linux/arm64/v8").unwrap(), d(1));
        assert_eq!(pick(&docker, "linux/arm/v7").unwrap(), d(2));
        assert!(pick(&docker, "linux/arm/v6").is_err());
        // No variant asked and none that is the default: the first of that
        // OS and architecture, as before.
        let only_v3 = index_of(&[("linux", "amd64", Some("v3"))]);
        assert_eq!(pick(&only_v3, "linux/amd64").unwrap(), d(1));
    }

    #[test]
    fn an_image() {
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}","config":{{"mediaType":"x","digest":"{}","size":2}},
               "layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"{}","size":5}},
                         {{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{}","size":6}}]}}"#,
            d(9),
            d(1),
            d(2)
        );
        let Document::Image(layers) = parse(m.as_bytes(), None).unwrap() else {
            panic!("not an image");
        };
        assert_eq!(layers.len(), 2);
        assert_eq!((layers[1].digest.clone(), layers[1].size), (d(2), 6));
    }

    #[test]
    fn hostile_documents_are_refused() {
        let layer = |digest: &str, t: &str| {
            format!(
                r#"{{"schemaVersion":2,"config":{{"digest":"{}","size":1}},"layers":[{{"mediaType":"{t}","digest":"{digest}","size":1}}]}}"#,
                d(1)
            )
        };
        let ok = "application/vnd.oci.image.layer.v1.tar";
        assert!(parse(layer(&d(2), ok).as_bytes(), None).is_ok());
        for bad in [
            layer("sha256:../../etc/passwd", ok),
            layer(&d(2).to_uppercase(), ok),
            layer("sha512:00", ok),
            r#"{"schemaVersion":1,"fsLayers":[]}"#.to_string(),
            r#"{"schemaVersion":2}"#.to_string(),
            r#"{"schemaVersion":2,"manifests":[],"layers":[]}"#.to_string(),
            format!(r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","manifests":[]}}"#),
            "[]".to_string(),
        ] {
            assert!(parse(bad.as_bytes(), None).is_err(), "{bad}");
        }
        let huge = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{}","size":1}},"layers":[{{"mediaType":"{ok}","digest":"{}","size":{}}}]}}"#,
            d(1),
            d(2),
            MAX_BLOB + 1
        );
        assert!(parse(huge.as_bytes(), None).is_err());
    }

    #[test]
    fn created_reads_rfc3339() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2023-11-14T22:13:20Z"), Some(1_700_000_000));
        assert_eq!(
            rfc3339_seconds("2023-11-14T23:13:20.5+01:00"),
            Some(1_700_000_000)
        );
        assert_eq!(rfc3339_seconds("1969-12-31T23:59:59Z"), Some(-1));
        for bad in [
            "",
            "2023-11-14",
            "2023-13-01T00:00:00Z",
            "2023-11-14T22:13:20",
            "x023-11-14T22:13:20Z",
        ] {
            assert_eq!(rfc3339_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn refusals_name_what_the_document_is() {
        let why = |doc: &str, ctype: Option<&str>| {
            format!("{:#}", parse(doc.as_bytes(), ctype).unwrap_err())
        };
        let no_layers = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"digest":"{}","size":1}}}}"#,
            d(1)
        );
        assert_eq!(why(&no_layers, None), "an image manifest without layers");
        assert_eq!(
            why(r#"{"schemaVersion":2}"#, Some(OCI_MANIFEST)),
            "an image manifest without layers"
        );
        assert!(why(r#"{"schemaVersion":1,"fsLayers":[]}"#, None).contains("Docker schema 1"));
    }
}
