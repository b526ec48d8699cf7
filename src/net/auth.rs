//! Registry credentials and the challenge flow: a Docker `config.json`
//! (`auths`, each with `auth` = base64 of `user:password` or `username` and
//! `password`; a Kubernetes `.dockerconfigjson` Secret mounted as a file is
//! the same document, an old `.dockercfg` the `auths` map alone), a
//! `WWW-Authenticate` challenge (Basic, or Bearer with realm, service and
//! scope), and the token a realm answers with. Pure parsers, fuzzed
//! (`fuzzing::docker_config`, `fuzzing::challenge`); the lookup reads one
//! file the user named or the environment points at, and runs the
//! credential helper it names (`credHelpers`, `credsStore`: `helper`).
//! Nothing is kept: each sync (each round of `--every`) looks up again, so
//! a rotated password, token or config is used from the next round on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use base64::Engine;
use serde::Deserialize;

use super::helper;
use crate::error;
use crate::sys;

/// A Docker config is a few entries; a mounted Secret is at most 1 MiB.
const MAX_CONFIG: u64 = 1 << 20;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({:?}, <hidden>)", self.user)
    }
}

impl Credentials {
    /// The `Authorization` value for Basic auth.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// A credential helper's identity token (its `Username` is `<token>`):
/// an OAuth2 refresh token, traded at a Bearer realm for an access token.
#[derive(Clone, PartialEq, Eq)]
pub struct IdentityToken(pub String);

impl std::fmt::Debug for IdentityToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityToken(<hidden>)")
    }
}

/// Where credentials come from, for messages.
#[derive(Clone, Debug, Default)]
pub struct Found {
    pub creds: Option<Credentials>,
    /// From a helper that answered `Username: <token>`.
    pub identity_token: Option<IdentityToken>,
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// The helper asked (`docker-credential-NAME`), if any.
    pub helper: Option<String>,
}

/// The docker CLI's user name for an identity token.
const TOKEN_USER: &str = "<token>";

/// Whose credentials a Docker config says to use for a host, in the
/// docker CLI's order (`configfile.GetCredentialsStore`): the
/// `credHelpers` entry for the host, else `credsStore`, else `auths`
/// (so an `auths` entry counts only where no helper is configured).
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// Run `docker-credential-NAME get` with `key` on its stdin.
    Helper { name: String, key: String },
    /// The `auths` entry.
    Auths(Option<Credentials>),
}

/// The credentials for `host` (`HOST[:PORT]`): from `flag` (`--registry-auth`,
/// which must be readable), else `$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json` (either may be absent); through the helper the
/// config names where it names one (bounded by `timeout`).
pub fn lookup(host: &str, flag: Option<&Path>, timeout: Duration) -> Result<Found> {
    if let Some(path) = flag {
        let data = sys::read_bounded(path, MAX_CONFIG).map_err(|e| {
            error::usage(format!(
                "{}: cannot read --registry-auth: {e}",
                path.display()
            ))
        })?;
        let choice = choose(&data, host)
            .map_err(|e| error::usage(format!("{}: bad --registry-auth: {e:#}", path.display())))?;
        return resolve(choice, path.to_path_buf(), timeout);
    }
    let candidates = [
        std::env::var_os("DOCKER_CONFIG").map(|d| PathBuf::from(d).join("config.json")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")),
    ];
    for path in candidates.into_iter().flatten() {
        let Ok(data) = sys::read_bounded(&path, MAX_CONFIG) else {
            continue;
        };
        let choice = choose(&data, host)
            .map_err(|e| anyhow::anyhow!("{}: bad Docker config: {e:#}", path.display()))?;
        return resolve(choice, path, timeout);
    }
    Ok(Found::default())
}

fn resolve(choice: Choice, file: PathBuf, timeout: Duration) -> Result<Found> {
    match choice {
        Choice::Auths(creds) => Ok(Found {
            creds,
            file: Some(file),
            ..Found::default()
        }),
        Choice::Helper { name, key } => {
            let reply = helper::get(&name, &key, timeout)?;
            let mut found = Found {
                file: Some(file),
                helper: Some(format!("docker-credential-{name}")),
                ..Found::default()
            };
            match reply {
                Some(r) if r.user == TOKEN_USER => {
                    found.identity_token = Some(IdentityToken(r.secret));
                }
                Some(r) => {
                    found.creds = Some(Credentials {
                        user: r.user,
                        password: r.secret,
                    });
                }
                None => {}
            }
            Ok(found)
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    auths: Option<BTreeMap<String, AuthEntry>>,
    #[serde(rename = "credHelpers")]
    cred_helpers: Option<BTreeMap<String, String>>,
    #[serde(rename = "credsStore")]
    creds_store: Option<String>,
}

/// Docker Hub's credentials live under this key, whatever the host is called.
const HUB_KEY: &str = "https://index.docker.io/v1/";

/// The key the docker CLI looks credentials up by (`getAuthConfigKey`).
fn auth_key(host: &str) -> String {
    match host.to_ascii_lowercase().as_str() {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => HUB_KEY.to_string(),
        h => h.to_string(),
    }
}

/// A helper NAME is the tail of a program name looked up on PATH.
fn helper_name(name: &str, field: &str) -> Result<String> {
    if name.is_empty()
        || name.len() > 100
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
    {
        bail!("{field} names {name:?}, which is not a credential helper's name");
    }
    Ok(name.to_string())
}

/// What a Docker config says to do for `host`: see `Choice`. A
/// `credHelpers` key is matched as an `auths` key is (without scheme,
/// path and case); the helper is sent the key as the config writes it
/// (`credHelpers`), or the host (`credsStore`), as the docker CLI does.
pub fn choose(data: &[u8], host: &str) -> Result<Choice> {
    if let Ok(cfg) = serde_json::from_slice::<ConfigFile>(data) {
        let want = auth_key(host);
        let bare = registry_key(&want);
        if let Some((key, name)) = cfg
            .cred_helpers
            .iter()
            .flatten()
            .find(|(k, _)| k.as_str() == want || (want != HUB_KEY && registry_key(k) == bare))
        {
            return Ok(Choice::Helper {
                name: helper_name(name, &format!("credHelpers[{key:?}]"))?,
                key: key.clone(),
            });
        }
        if let Some(store) = cfg.creds_store.filter(|s| !s.is_empty()) {
            return Ok(Choice::Helper {
                name: helper_name(&store, "credsStore")?,
                key: want,
            });
        }
    }
    credentials_for(data, host).map(Choice::Auths)
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The credentials a Docker config (or `.dockerconfigjson`, or
/// `.dockercfg`) holds for `host`; keys may carry a scheme and a path
/// (`https://registry.example/v1/`), compared without them, and host names
/// without case.
pub fn credentials_for(data: &[u8], host: &str) -> Result<Option<Credentials>> {
    let auths = match serde_json::from_slice::<ConfigFile>(data) {
        Ok(ConfigFile { auths: Some(a), .. }) => a,
        // `.dockercfg`: the map itself.
        _ => match serde_json::from_slice::<BTreeMap<String, serde_json::Value>>(data) {
            Ok(top) if !top.contains_key("auths") => top
                .into_iter()
                .filter_map(|(k, v)| Some((k, serde_json::from_value::<AuthEntry>(v).ok()?)))
                .collect(),
            Ok(_) => bail!("\"auths\" is not a map of registries"),
            Err(e) => bail!("not JSON: {e}"),
        },
    };
    let want = host.to_ascii_lowercase();
    let Some(entry) = auths
        .iter()
        .find(|(k, _)| registry_key(k) == want)
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    if let Some(b64) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|_| anyhow::anyhow!("the \"auth\" of {host} is not base64"))?;
        let text = String::from_utf8(raw)
            .map_err(|_| anyhow::anyhow!("the \"auth\" of {host} is not text"))?;
        let Some((user, password)) = text.split_once(':') else {
            bail!("the \"auth\" of {host} is not user:password");
        };
        return Ok(Some(Credentials {
            user: user.to_string(),
            password: password.to_string(),
        }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) => Ok(Some(Credentials {
            user: u.clone(),
            password: p.clone(),
        })),
        _ => Ok(None),
    }
}

/// `https://Registry.example:5000/v1/` → `registry.example:5000`.
fn registry_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or("").to_ascii_lowercase()
}

/// A `WWW-Authenticate` challenge: its scheme (lowercase) and parameters
/// (names lowercase).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `Bearer realm="https://auth.example/token",service="registry.example",scope="repository:x:pull"`
/// or `Basic realm="x"`. Only the first challenge is read (a registry
/// sends one). `None` for what does not parse.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = match header.split_once(char::is_whitespace) {
        Some((s, r)) => (s, r.trim_start()),
        None => (header, ""),
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return None;
    }
    let mut params = Vec::new();
    let mut s = rest;
    while !s.is_empty() {
        let (name, after) = s.split_once('=')?;
        let name = name.trim().trim_start_matches(',').trim();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return None;
        }
        let after = after.trim_start();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => v.push(chars.next()?.1),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => v.push(c),
                }
            }
            (v, &q[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((name.to_ascii_lowercase(), value));
        s = tail.trim_start();
        s = s.strip_prefix(',').unwrap_or(s).trim_start();
        if params.len() > 16 {
            return None;
        }
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

#[derive(Deserialize)]
struct TokenReply {
    token: Option<String>,
    access_token: Option<String>,
}

/// The token of a realm's JSON answer (`token`, or `access_token`): a
/// header value, so no control characters.
pub fn parse_token(body: &[u8]) -> Result<String> {
    let reply: TokenReply =
        serde_json::from_slice(body).map_err(|e| anyhow::anyhow!("bad token answer: {e}"))?;
    let token = reply
        .token
        .filter(|t| !t.is_empty())
        .or(reply.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow::anyhow!("the token answer holds no token"))?;
    if token.len() > 64 << 10 || token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        bail!("the token answer holds an unusable token");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_configs() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("ann:pa:ss");
        let cfg = format!(
            r#"{{"auths":{{"https://Registry.example:5000/v1/":{{"auth":"{b64}"}},
                "other.example":{{"username":"bob","password":"pw"}}}},"credsStore":"x"}}"#
        );
        let c = credentials_for(cfg.as_bytes(), "registry.example:5000")
            .unwrap()
            .unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("ann", "pa:ss"));
        let c = credentials_for(cfg.as_bytes(), "other.example")
            .unwrap()
            .unwrap();
        assert_eq!(c.user, "bob");
        assert_eq!(
            credentials_for(cfg.as_bytes(), "third.example").unwrap(),
            None
        );
        assert_eq!(
            credentials_for(cfg.as_bytes(), "registry.example").unwrap(),
            None
        );
        // The old .dockercfg shape.
        let old = format!(r#"{{"registry.example":{{"auth":"{b64}"}}}}"#);
        assert!(credentials_for(old.as_bytes(), "registry.example")
            .unwrap()
            .is_some());
        assert!(credentials_for(b"not json", "x").is_err());
        assert!(credentials_for(br#"{"auths":{"x":{"auth":"!!"}}}"#, "x").is_err());
        assert!(format!("{c:?}").contains("hidden") && !format!("{c:?}").contains("pw"));
        assert_eq!(
            Credentials {
                user: "a".into(),
                password: "b".into()
            }
            .basic(),
            "Basic YTpi"
        );
    }

    #[test]
    fn helpers_are_chosen_in_the_docker_cli_order() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("ann:pw");
        let cfg = format!(
            r#"{{"auths":{{"a.example":{{"auth":"{b64}"}},"b.example":{{"auth":"{b64}"}}}},
                "credHelpers":{{"https://A.example/":"ecr-login","docker.io":"hub"}},"credsStore":"pass"}}"#
        );
        let helper = |name: &str, key: &str| Choice::Helper {
            name: name.into(),
            key: key.into(),
        };
        // credHelpers for the host, sent the key as written; then credsStore
        // (before the auths entry, as the docker CLI does).
        assert_eq!(
            choose(cfg.as_bytes(), "a.example").unwrap(),
            helper("ecr-login", "https://A.example/")
        );
        assert_eq!(
            choose(cfg.as_bytes(), "b.example").unwrap(),
            helper("pass", "b.example")
        );
        assert_eq!(
            choose(cfg.as_bytes(), "docker.io").unwrap(),
            helper("pass", HUB_KEY)
        );
        // No helper: the auths entry.
        let plain = format!(r#"{{"auths":{{"a.example":{{"auth":"{b64}"}}}},"credsStore":""}}"#);
        assert!(matches!(
            choose(plain.as_bytes(), "a.example").unwrap(),
            Choice::Auths(Some(_))
        ));
        // A helper name is a program name's tail, not a path.
        assert!(choose(br#"{"credsStore":"../../bin/sh"}"#, "x").is_err());
        assert!(choose(br#"{"credHelpers":{"x":"a b"}}"#, "x").is_err());
    }

    #[test]
    fn challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("service"), Some("registry.example"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull"));
        let b = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(
            (b.scheme.as_str(), b.param("realm")),
            ("basic", Some("Registry Realm"))
        );
        assert_eq!(parse_challenge("Basic").unwrap().params, vec![]);
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
        assert!(parse_challenge("").is_none());
    }

    #[test]
    fn tokens() {
        assert_eq!(parse_token(br#"{"token":"abc"}"#).unwrap(), "abc");
        assert_eq!(
            parse_token(br#"{"access_token":"xyz","expires_in":60}"#).unwrap(),
            "xyz"
        );
        assert!(parse_token(br#"{"token":""}"#).is_err());
        assert!(parse_token(br#"{"token":"a\r\nb"}"#).is_err());
        assert!(parse_token(b"[]").is_err());
    }
}
