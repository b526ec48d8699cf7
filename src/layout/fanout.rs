//! `--layout fanout` and `--slot`: DEST stays a real directory (a volume
//! root that consumers mount), the scheme of kubelet's ConfigMap volumes.
//!
//! ```text
//! DEST/..data         -> ..packsync/gen/<GEN>               data link, swapped by rename(2)
//! DEST/..data-<slot>  -> ..packsync/slots/<slot>/gen/<GEN>  one data link per slot
//! DEST/<entry>        -> ..data/<entry>                     one link per top-level entry
//! DEST/..packsync/    gen/ meta/ stage/ trash/ leases/      the unslotted state (see volume.rs)
//!      ..packsync/slots/<slot>/gen/ ...                     each slot's own state
//!      ..packsync/claims/<entry> -> ..data-<slot>           which data link owns an entry
//! ```
//!
//! Names starting with `..` are packsync's: a source may not have such a
//! top-level entry. `lost+found` (made by mkfs at a volume root) is left
//! alone unless a source has an entry of that name.
//!
//! Ownership. An entry link's target names the data link it goes through, so
//! the links on disk say which slot owns what; a slot only ever creates,
//! replaces or removes links that go through its own data link. To add an
//! entry a slot first claims it: `symlinkat(claims/<entry>)` creates the claim
//! or fails because it exists, so of two slots racing for a new name exactly
//! one wins, and the other refuses (exit 3) before its data link moves:
//! readers see nothing change. Claims are made after staging, right before
//! the data link is swapped. A claim whose slot does not publish the entry
//! and that is older than an hour (a writer killed between claim and swap)
//! is stale and may be taken over; two slots taking over the same stale claim
//! at the same instant is the one window left, and the loser then warns that
//! it could not link the entry.
//!
//! Links follow the data link. After its swap a writer makes its slot's entry
//! links match whatever generation the slot's data link shows at that moment
//! (links of added entries appear, links of removed ones go), and does so
//! again until the data link reads the same before and after. Writers of one
//! slot that race therefore converge on the tree of the last swap.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};

use crate::config::STALE_STAGE;
use crate::error;
use crate::report::escape;
use crate::staging::Stage;
use crate::sys;
use crate::volume::{unique_name, State, Volume};

/// The state root inside DEST.
pub const STATE: &[u8] = b"..packsync";
const DATA: &[u8] = b"..data";
const CLAIMS: &[u8] = b"claims";
const SLOTS: &[u8] = b"slots";
const LOST_FOUND: &[u8] = b"lost+found";

/// A slot name: what may follow `..data-` and name a directory.
pub fn valid_slot(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// The data link of `slot`: `..data` or `..data-<slot>`.
pub fn data_link(slot: Option<&str>) -> Vec<u8> {
    let mut n = DATA.to_vec();
    if let Some(s) = slot {
        n.push(b'-');
        n.extend_from_slice(s.as_bytes());
    }
    n
}

/// The state directory of `slot`, relative to DEST.
pub fn state_name(slot: Option<&str>) -> Vec<u8> {
    let mut n = STATE.to_vec();
    if let Some(s) = slot {
        n.extend_from_slice(b"/slots/");
        n.extend_from_slice(s.as_bytes());
    }
    n
}

/// Top-level names packsync keeps for itself.
pub fn reserved(name: &[u8]) -> bool {
    name.starts_with(b"..")
}

/// Whether `name` is a data link name (`..data`, `..data-<slot>`).
fn is_data_link(name: &[u8]) -> bool {
    name == DATA
        || name
            .strip_prefix(b"..data-")
            .is_some_and(|s| std::str::from_utf8(s).is_ok_and(valid_slot))
}

/// "slot NAME" or "the sync without --slot", for messages.
fn describe(link: &[u8]) -> String {
    match link.strip_prefix(b"..data-") {
        Some(s) => format!("slot {}", escape(s)),
        None => "the sync without --slot".into(),
    }
}

/// Slots with state at DEST: the unslotted one (`None`) first, then by name.
pub fn slots(dest: BorrowedFd<'_>) -> std::io::Result<Vec<Option<String>>> {
    let root = sys::open_dir_at(dest, STATE)?;
    let mut out = Vec::new();
    if sys::exists_at(root.as_fd(), b"gen")? {
        out.push(None);
    }
    if let Ok(fd) = sys::open_dir_at(root.as_fd(), SLOTS) {
        let mut names: Vec<String> = sys::list_dir(fd.as_fd())?
            .into_iter()
            .filter_map(|l| String::from_utf8(l.name).ok())
            .filter(|s| valid_slot(s))
            .collect();
        names.sort();
        out.extend(names.into_iter().map(Some));
    }
    Ok(out)
}

/// A listing of `dir` through a handle of its own (a listing reads on from
/// where the last one on the same handle stopped).
fn list(dir: BorrowedFd<'_>) -> std::io::Result<Vec<sys::Listed>> {
    sys::list_dir(sys::open_dir_at(dir, b".")?.as_fd())
}

/// Who a top-level entry of DEST belongs to.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    Absent,
    /// A link through this data link.
    Link(Vec<u8>),
    /// Not made by packsync; whether it is a directory.
    Foreign {
        dir: bool,
    },
}

/// Who owns `name`, as `mine` sees it: a link through another data link that
/// no longer exists (its slot was removed by hand) counts as not packsync's.
fn owner_for(dest: BorrowedFd<'_>, name: &[u8], mine: &[u8]) -> Result<Owner> {
    Ok(match owner(dest, name)? {
        Owner::Link(link) if link != mine && !sys::exists_at(dest, &link).unwrap_or(true) => {
            Owner::Foreign { dir: false }
        }
        o => o,
    })
}

fn owner(dest: BorrowedFd<'_>, name: &[u8]) -> Result<Owner> {
    match sys::readlink_at(dest, name) {
        Ok(t) => {
            let link = t
                .strip_suffix(name)
                .and_then(|p| p.strip_suffix(b"/"))
                .filter(|l| is_data_link(l));
            Ok(match link {
                Some(l) => Owner::Link(l.to_vec()),
                None => Owner::Foreign { dir: false },
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Owner::Absent),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let dir = sys::stat_at(dest, name)
                .map(|st| sys::kind_of(&st) == sys::StatKind::Dir)
                .unwrap_or(false);
            Ok(Owner::Foreign { dir })
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", escape(name))),
    }
}

/// What the state of DEST means for this slot's sync, decided before
/// anything is written.
#[derive(Debug, Default)]
pub struct Check {
    /// Entries packsync did not make that `--adopt` replaces or removes.
    pub adopt: Vec<Vec<u8>>,
    /// This slot's entry links do not match its live generation (a writer was
    /// killed between its swap and its links, or someone edited DEST).
    pub repair: bool,
}

/// Refuse (exit 3) a sync of `vol`'s slot that would publish `names` (the new
/// tree's top-level entries) when another slot owns or claims one of them,
/// or when DEST holds entries packsync did not make and `adopt` is off.
/// `live` is the top-level of the slot's live generation, if any.
pub fn check(vol: &Volume, names: &[&[u8]], live: Option<&[&[u8]]>, adopt: bool) -> Result<Check> {
    if let Some(bad) = names.iter().find(|n| reserved(n)) {
        return Err(error::usage(format!(
            "{}: the source has a top-level entry {}, and --layout fanout keeps names starting with .. for itself",
            vol.display,
            escape(bad)
        )));
    }
    let want: BTreeSet<&[u8]> = names.iter().copied().collect();
    let dest = vol.parent.as_fd();
    let mut out = Check::default();
    let mut conflicts: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut mine = BTreeSet::new();
    let listing = list(dest).with_context(|| format!("cannot list {}", vol.display))?;
    for l in listing {
        let n = l.name;
        if n == STATE || is_data_link(&n) {
            continue;
        }
        match owner_for(dest, &n, &vol.name)? {
            Owner::Absent => {}
            Owner::Link(link) if link == vol.name => {
                mine.insert(n);
            }
            Owner::Link(link) => {
                if want.contains(n.as_slice()) {
                    conflicts.push((n, link));
                }
            }
            Owner::Foreign { dir } => {
                // The unslotted sync mirrors its source into DEST; a slot owns
                // only what it publishes and leaves other entries alone.
                let mirrored = vol.slot.is_none() && !(n == LOST_FOUND && dir);
                if want.contains(n.as_slice()) || mirrored {
                    out.adopt.push(n);
                }
            }
        }
    }
    if let Some(claims) = open_claims(vol, false) {
        for n in &want {
            if mine.contains(*n) || conflicts.iter().any(|c| c.0 == *n) {
                continue;
            }
            if let Ok(link) = sys::readlink_at(claims.as_fd(), n) {
                if link != vol.name && claim_holds(vol, claims.as_fd(), n, &link) {
                    conflicts.push((n.to_vec(), link));
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflict(vol, &conflicts));
    }
    if !out.adopt.is_empty() && !adopt {
        return Err(error::refused(format!(
            "{}: holds {} that packsync did not create; pass --adopt to replace {}",
            vol.display,
            entry_list(&out.adopt),
            if out.adopt.len() == 1 { "it" } else { "them" }
        )));
    }
    let live: BTreeSet<&[u8]> = live.unwrap_or_default().iter().copied().collect();
    out.repair = mine.iter().map(Vec::as_slice).collect::<BTreeSet<_>>() != live;
    Ok(out)
}

fn entry_list(names: &[Vec<u8>]) -> String {
    let mut shown: Vec<String> = names.iter().take(5).map(|n| escape(n)).collect();
    if names.len() > 5 {
        shown.push(format!("and {} more", names.len() - 5));
    }
    format!(
        "{} {}",
        if names.len() == 1 { "entry" } else { "entries" },
        shown.join(", ")
    )
}

fn conflict(vol: &Volume, conflicts: &[(Vec<u8>, Vec<u8>)]) -> anyhow::Error {
    let what: Vec<String> = conflicts
        .iter()
        .take(5)
        .map(|(n, link)| format!("{} belongs to {}", escape(n), describe(link)))
        .collect();
    error::refused(format!(
        "{}: {}; an entry can belong to one slot only (nothing was changed)",
        vol.display,
        what.join(", ")
    ))
}

fn open_claims(vol: &Volume, create: bool) -> Option<OwnedFd> {
    let root = if create {
        sys::ensure_dir_at(vol.parent.as_fd(), STATE, 0o755).ok()?
    } else {
        sys::open_dir_at(vol.parent.as_fd(), STATE).ok()?
    };
    if create {
        sys::ensure_dir_at(root.as_fd(), CLAIMS, 0o755).ok()
    } else {
        sys::open_dir_at(root.as_fd(), CLAIMS).ok()
    }
}

/// Whether another data link's claim on `name` still stands: its entry link
/// is there, its live generation has the entry, or its slot's state exists
/// and the claim is recent (its writer may be publishing right now).
fn claim_holds(vol: &Volume, claims: BorrowedFd<'_>, name: &[u8], link: &[u8]) -> bool {
    let dest = vol.parent.as_fd();
    if owner_for(dest, name, b"").ok() == Some(Owner::Link(link.to_vec())) {
        return true;
    }
    let in_live = sys::readlink_at(dest, link)
        .ok()
        .and_then(|t| crate::layout::open_beneath(dest, &t).ok())
        .is_some_and(|g| sys::exists_at(g.as_fd(), name).unwrap_or(false));
    if in_live {
        return true;
    }
    // A slot removed by hand (its state gone) holds nothing.
    let slot_state = match link.strip_prefix(b"..data-") {
        Some(slot) => [STATE, b"/slots/", slot].concat(),
        None => [STATE, b"/gen"].concat(),
    };
    if crate::layout::open_beneath(dest, &slot_state).is_err() {
        return false;
    }
    match sys::stat_at(claims, name) {
        Ok(st) => {
            let age = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs() as i64
                - sys::mtime_of(&st).0;
            age < STALE_STAGE.as_secs() as i64
        }
        Err(_) => false,
    }
}

/// Claim every name in `names` for `vol`'s slot, before its data link shows
/// them. Refuses (exit 3), releasing what it claimed, when another slot holds one.
pub fn claim(vol: &Volume, names: &[Vec<u8>]) -> Result<()> {
    let claims = open_claims(vol, true)
        .with_context(|| format!("cannot create {}/..packsync/claims", vol.display))?;
    let c = claims.as_fd();
    let mut made: Vec<&[u8]> = Vec::new();
    let mut conflicts = Vec::new();
    for n in names {
        let mut tries = 0;
        loop {
            tries += 1;
            match sys::symlink_at(&vol.name, c, n) {
                Ok(()) => {
                    made.push(n);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => {
                    let Ok(link) = sys::readlink_at(c, n) else {
                        continue; // released meanwhile: try again
                    };
                    if link == vol.name {
                        break;
                    }
                    if claim_holds(vol, c, n, &link) {
                        conflicts.push((n.clone(), link));
                        break;
                    }
                    // Stale: replace it with ours in one rename.
                    let tmp = format!("..{}", unique_name());
                    sys::symlink_at(&vol.name, c, tmp.as_bytes())
                        .context("cannot write a claim")?;
                    sys::rename_at(c, tmp.as_bytes(), c, n).context("cannot write a claim")?;
                    made.push(n);
                    break;
                }
                Err(e) => {
                    release(c, &vol.name, &made);
                    return Err(e)
                        .with_context(|| format!("cannot claim {} in {}", escape(n), vol.display));
                }
            }
        }
    }
    // A link of another slot without a claim (claims came later, or were removed by hand).
    for n in names {
        if let Owner::Link(link) = owner_for(vol.parent.as_fd(), n, &vol.name)? {
            if link != vol.name && !conflicts.iter().any(|x| &x.0 == n) {
                conflicts.push((n.clone(), link));
            }
        }
    }
    if !conflicts.is_empty() {
        release(c, &vol.name, &made);
        return Err(conflict(vol, &conflicts));
    }
    Ok(())
}

fn release(claims: BorrowedFd<'_>, link: &[u8], names: &[&[u8]]) {
    for n in names {
        if sys::readlink_at(claims, n).is_ok_and(|l| l == link) {
            let _ = sys::unlink_at(claims, n);
        }
    }
}

/// The top-level names of `gen` in `state`.
pub fn top_level(state: &State, gen: &str) -> Result<Vec<Vec<u8>>> {
    let fd = state.open_gen(gen)?;
    let mut names: Vec<Vec<u8>> = sys::list_dir(fd.as_fd())
        .with_context(|| format!("cannot list {}/gen/{gen}", state.path.display()))?
        .into_iter()
        .map(|l| l.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Make `vol`'s entry links match the generation its data link shows, until
/// the data link stays put. With `adopt` (and a staging directory to build
/// replacements in), entries packsync did not make give way: replaced when
/// the generation has them, removed by the unslotted sync otherwise.
/// Returns warnings (entries it had to leave as they are).
pub fn reconcile(vol: &Volume, state: &State, adopt: Option<&Stage>) -> Result<Vec<String>> {
    let dest = vol.parent.as_fd();
    let prefix = vol.link_target("");
    let mut warnings = Vec::new();
    for _ in 0..16 {
        warnings.clear();
        let before = read_link(vol)?;
        let names: BTreeSet<Vec<u8>> = match &before {
            Some(t) => match t.strip_prefix(prefix.as_slice()) {
                Some(gen) => top_level(state, &String::from_utf8_lossy(gen))?
                    .into_iter()
                    .collect(),
                None => anyhow::bail!(
                    "{}: {} is not a packsync link",
                    vol.display,
                    escape(&vol.name)
                ),
            },
            None => BTreeSet::new(),
        };
        let claims = open_claims(vol, !names.is_empty());
        // Links that go: this slot's links to entries its tree no longer has.
        for l in list(dest).with_context(|| format!("cannot list {}", vol.display))? {
            let n = l.name;
            if n == STATE || is_data_link(&n) || names.contains(&n) {
                continue;
            }
            match owner_for(dest, &n, &vol.name)? {
                Owner::Link(link) if link == vol.name => {
                    match sys::unlink_at(dest, &n) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(e).with_context(|| {
                                format!("cannot remove {}/{}", vol.display, escape(&n))
                            })
                        }
                        _ => {}
                    }
                    if let Some(c) = &claims {
                        release(c.as_fd(), &vol.name, &[&n]);
                    }
                }
                Owner::Foreign { dir }
                    if adopt.is_some() && vol.slot.is_none() && !(dir && n == LOST_FOUND) =>
                {
                    remove_foreign(vol, state, &n)?;
                }
                _ => {}
            }
        }
        // Links that come: entries of the tree without their link.
        for n in &names {
            if let Some(c) = &claims {
                let _ = sys::symlink_at(&vol.name, c.as_fd(), n);
            }
            let mut target = vol.name.clone();
            target.push(b'/');
            target.extend_from_slice(n);
            match owner_for(dest, n, &vol.name)? {
                Owner::Absent => match sys::symlink_at(&target, dest, n) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("cannot link {}/{}", vol.display, escape(n)))
                    }
                },
                Owner::Link(link) if link == vol.name => {}
                Owner::Link(link) => warnings.push(format!(
                    "{}/{}: belongs to {}; not linked",
                    vol.display,
                    escape(n),
                    describe(&link)
                )),
                Owner::Foreign { dir } => match adopt {
                    Some(stage) => replace_foreign(vol, state, stage, n, &target, dir)?,
                    None => warnings.push(format!(
                        "{}/{}: not created by packsync; not linked (pass --adopt to replace it)",
                        vol.display,
                        escape(n)
                    )),
                },
            }
        }
        if read_link(vol)? == before {
            return Ok(warnings);
        }
    }
    warnings.push(format!(
        "{}: other writers kept moving {}; their last one sets its links",
        vol.display,
        escape(&vol.name)
    ));
    Ok(warnings)
}

fn read_link(vol: &Volume) -> Result<Option<Vec<u8>>> {
    match sys::readlink_at(vol.parent.as_fd(), &vol.name) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("cannot read {}/{}", vol.display, escape(&vol.name)))
        }
    }
}

/// Put the link in place of an entry packsync did not make: one rename over a
/// file or link; for a directory, one exchange where the filesystem has it,
/// else move it aside first (the name is missing for an instant).
fn replace_foreign(
    vol: &Volume,
    state: &State,
    stage: &Stage,
    name: &[u8],
    target: &[u8],
    dir: bool,
) -> Result<()> {
    let dest = vol.parent.as_fd();
    let shown = || format!("{}/{}", vol.display, escape(name));
    let _ = sys::remove_tree_at(stage.fd(), b"adopt");
    sys::symlink_at(target, stage.fd(), b"adopt").context("cannot create a link in staging")?;
    if dir {
        match sys::rename_exchange(stage.fd(), b"adopt", dest, name) {
            Ok(()) => {
                let _ = sys::remove_tree_at(stage.fd(), b"adopt");
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                remove_foreign(vol, state, name)?;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot replace {}", shown())),
        }
    }
    sys::rename_at(stage.fd(), b"adopt", dest, name)
        .with_context(|| format!("cannot replace {}", shown()))
}

/// Bring `vol`'s entry links in line with its live generation without
/// publishing anything (an up-to-date sync, `gc`): repairs what a killed
/// writer or a hand edit left, and with `adopt` replaces foreign entries.
pub fn repair(vol: &Volume, state: &State, adopt: bool) -> Result<Vec<String>> {
    if !adopt {
        return reconcile(vol, state, None);
    }
    let stage = Stage::new(state)?;
    reconcile(vol, state, Some(&stage))
}

/// Move an entry packsync did not make out of DEST and delete it.
fn remove_foreign(vol: &Volume, state: &State, name: &[u8]) -> Result<()> {
    let aside = unique_name();
    sys::rename_at(
        vol.parent.as_fd(),
        name,
        state.trash.as_fd(),
        aside.as_bytes(),
    )
    .with_context(|| format!("cannot remove {}/{}", vol.display, escape(name)))?;
    // What cannot go yet (files open on NFS) stays in trash/ for a later run.
    let _ = sys::remove_tree_at(state.trash.as_fd(), aside.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_stay_one_path_component() {
        for good in ["st2packs-hello", "a", "v1.2_x"] {
            assert!(valid_slot(good), "{good}");
        }
        for bad in ["", ".hidden", "-x", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(!valid_slot(bad), "{bad}");
        }
    }

    #[test]
    fn data_links_and_state_names() {
        assert_eq!(data_link(None), b"..data");
        assert_eq!(data_link(Some("ops")), b"..data-ops");
        assert_eq!(state_name(Some("ops")), b"..packsync/slots/ops");
        assert!(is_data_link(b"..data") && is_data_link(b"..data-ops"));
        assert!(!is_data_link(b"..data-") && !is_data_link(b"..database"));
        assert!(reserved(b"..x") && !reserved(b".x"));
    }
}
