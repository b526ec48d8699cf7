//! The references of image sources, parsed before anything is read (a
//! malformed one is a usage error, exit 2): `oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX][//PATH]`
//! and `oci-layout:DIR[:TAG][//PATH]`, and the `//PATH` any non-directory
//! SOURCE may end in. Pure; fuzzed (`fuzzing::oci_reference`).

use anyhow::{bail, Result};

/// `oci://…`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `HOST[:PORT]`, lowercase.
    pub host: String,
    /// `a/b/c`: lowercase path components.
    pub repo: String,
    /// The tag (`latest` when neither a tag nor a digest is given).
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
    /// The `//PATH` subtree, without leading or trailing `/`.
    pub subpath: Option<Vec<u8>>,
}

impl Reference {
    /// What the manifest request names: the digest if given, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

/// Split `//PATH` off a SOURCE: the part before, and PATH's components
/// joined by `/`. The first `//` after the scheme's own separates (a host,
/// a repository or a URL path has none). PATH must not be empty, nor hold
/// `.` or `..` components.
pub fn split_subpath(arg: &str, after: usize) -> Result<(&str, Option<Vec<u8>>)> {
    let Some(at) = arg[after..].find("//").map(|i| i + after) else {
        return Ok((arg, None));
    };
    let path = &arg[at + 2..];
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        bail!("empty //PATH");
    }
    if parts
        .iter()
        .any(|p| *p == "." || *p == ".." || p.contains('\0'))
    {
        bail!("//PATH must not hold . or .. components");
    }
    Ok((&arg[..at], Some(parts.join("/").into_bytes())))
}

/// `oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX][//PATH]`.
pub fn parse(arg: &str) -> Result<Reference> {
    let Some(rest) = arg.strip_prefix("oci://") else {
        bail!("expected oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]");
    };
    if arg.len() > 4096 {
        bail!("the reference is too long");
    }
    let (main, subpath) = split_subpath(rest, 0)?;
    let Some((host, path)) = main.split_once('/') else {
        bail!("no repository after the host (oci://HOST/REPO:TAG)");
    };
    let host = parse_host(host)?;
    let (path, digest) = match path.split_once('@') {
        Some((p, d)) => (p, Some(parse_digest(d)?)),
        None => (path, None),
    };
    // A tag is after the last component's colon.
    let last = path.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match path[last..].find(':') {
        Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
        None => (path, None),
    };
    if repo.is_empty() || repo.len() > 255 || !repo.split('/').all(valid_component) {
        bail!("{repo:?} is not a repository name (lowercase letters, digits, '.', '_', '-', components separated by '/')");
    }
    if let Some(t) = tag {
        if !valid_tag(t) {
            bail!("{t:?} is not a tag (letters, digits, '_', '.', '-', at most 128)");
        }
    }
    Ok(Reference {
        host,
        repo: repo.to_string(),
        tag: tag.map(str::to_string),
        digest,
        subpath,
    })
}

/// `HOST[:PORT]`: a DNS name, an IPv4 address or `[IPv6]`, lowercase.
fn parse_host(h: &str) -> Result<String> {
    let (name, port) = if let Some(v6) = h.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            bail!("{h:?} is not a host");
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            bail!("{h:?} is not a host");
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| anyhow::anyhow!("{h:?} is not a host"))?,
            ),
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        let (n, p) = match h.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if n.is_empty() || n.len() > 253 || !n.split('.').all(label_ok) {
            bail!("{h:?} is not a host[:port]");
        }
        (n.to_ascii_lowercase(), p)
    };
    match port {
        None => Ok(name),
        Some(p) => {
            let ok = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            match p.parse::<u16>() {
                Ok(n) if ok && n > 0 => Ok(format!("{name}:{n}")),
                _ => bail!("{p:?} is not a port"),
            }
        }
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, as the distribution spec names a component.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or a run of "-".
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
pub fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&x| x.is_ascii_alphanumeric() || x == b'_' || x == b'.' || x == b'-')
}

/// `sha256:` and 64 lowercase hex digits: the only digests accepted,
/// anywhere (they name files and URLs).
pub fn parse_digest(d: &str) -> Result<String> {
    if !valid_digest(d) {
        bail!("{d:?} is not a sha256:<64 hex digits> digest");
    }
    Ok(d.to_string())
}

pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `oci-layout:DIR[:TAG][//PATH]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutRef {
    pub dir: String,
    pub tag: Option<String>,
    pub subpath: Option<Vec<u8>>,
}

/// `oci-layout:DIR[:TAG][//PATH]`: TAG is what follows DIR's last `:` when
/// it is a valid tag holding no `/` (a DIR with a colon in its last
/// component needs `:TAG` after it); DIR must not hold `//`.
pub fn parse_layout(arg: &str) -> Result<LayoutRef> {
    let Some(rest) = arg.strip_prefix("oci-layout:") else {
        bail!("expected oci-layout:DIR[:TAG]");
    };
    if arg.len() > 4096 {
        bail!("the reference is too long");
    }
    let (main, subpath) = split_subpath(rest, 0)?;
    let (dir, tag) = match main.rfind(':') {
        Some(i) if !main[i + 1..].contains('/') => {
            let t = &main[i + 1..];
            if !valid_tag(t) {
                bail!("{t:?} is not a tag (letters, digits, '_', '.', '-', at most 128)");
            }
            (&main[..i], Some(t.to_string()))
        }
        _ => (main, None),
    };
    if dir.is_empty() {
        bail!("no directory (oci-layout:DIR[:TAG])");
    }
    Ok(LayoutRef {
        dir: dir.to_string(),
        tag,
        subpath,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references() {
        let r =
            parse("oci://Registry.example:5000/st2/packs:1.4.2//opt/stackstorm/packs/").unwrap();
        assert_eq!(r.host, "registry.example:5000");
        assert_eq!(r.repo, "st2/packs");
        assert_eq!(r.tag.as_deref(), Some("1.4.2"));
        assert_eq!(r.subpath.as_deref(), Some(&b"opt/stackstorm/packs"[..]));
        assert_eq!(r.manifest_ref(), "1.4.2");
        let r = parse(&format!("oci://127.0.0.1:5000/x@{D}")).unwrap();
        assert_eq!((r.tag, r.digest.as_deref()), (None, Some(D)));
        let r = parse(&format!("oci://[::1]:5000/a/b:t@{D}")).unwrap();
        assert_eq!(r.host, "[::1]:5000");
        assert_eq!(parse("oci://[::A0]/x").unwrap().host, "[::a0]");
        assert_eq!(r.manifest_ref(), D);
        let r = parse("oci://registry.example/x").unwrap();
        assert_eq!((r.manifest_ref(), r.tag.as_deref()), ("latest", None));
        for bad in [
            "oci://",
            "oci://host",
            "oci://host/",
            "oci://host/UPPER:1",
            "oci://host/a:b:c",
            "oci://host/a:-t",
            "oci://host:99999/a",
            "oci://host:/a",
            "oci://ho st/a",
            "oci://host/a@sha256:abc",
            "oci://host/a@md5:0123",
            "oci://host/a:1//",
            "oci://host/a:1//x/../y",
            "oci://[zz]/a",
            "oci://-host/a",
            "oci://host/a--",
            "oci://host/.a",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("oci://host/a-b/c__d/e.f/g---h:v1.2_3-x").is_ok());
    }

    #[test]
    fn layouts() {
        let l = parse_layout("oci-layout:/tmp/img:v1//etc").unwrap();
        assert_eq!(l.dir, "/tmp/img");
        assert_eq!(l.tag.as_deref(), Some("v1"));
        assert_eq!(l.subpath.as_deref(), Some(&b"etc"[..]));
        let l = parse_layout("oci-layout:./img").unwrap();
        assert_eq!((l.dir.as_str(), l.tag), ("./img", None));
        let l = parse_layout("oci-layout:/a:b/img").unwrap();
        assert_eq!((l.dir.as_str(), l.tag), ("/a:b/img", None));
        for bad in [
            "oci-layout:",
            "oci-layout::v1",
            "oci-layout:/x:",
            "oci-layout:/x:bad tag",
        ] {
            assert!(parse_layout(bad).is_err(), "{bad}");
        }
    }
}
