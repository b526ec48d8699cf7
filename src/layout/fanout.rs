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
use std::io;
use std::ops::ControlFlow::{Break, Continue};

use anyhow::{Context, Result};

use super::{symlink, Check, Driver, LiveTree, Options, Published};
use crate::clock;
use crate::config::{Layout, STALE_STAGE};
use crate::error;
use crate::escape::c_style;
use crate::staging::Stage;
use crate::sys::{self, DirFd};
use crate::volume::{unique_name, Dest, State, Volume};

/// The state root inside DEST.
pub const STATE: &[u8] = b"..packsync";
const DATA: &[u8] = b"..data";
const CLAIMS: &[u8] = b"claims";
const SLOTS: &[u8] = b"slots";
const LOST_FOUND: &[u8] = b"lost+found";

pub struct Fanout;

impl Driver for Fanout {
    fn name(&self) -> &'static str {
        "fanout"
    }

    /// The published name is the slot's data link inside DEST, the state
    /// `DEST/..packsync[/slots/<slot>]`. A DEST that is absent is made by the
    /// first `Volume::state(true)` (an existing empty directory, such as a
    /// volume's mount point, is the usual first case).
    fn open(&self, base: Volume, slot: Option<&str>) -> Result<Volume> {
        let display = base.display.clone();
        base.inside_dest(data_link(slot), state_name(slot), Layout::Fanout, slot)
            .map_err(|e| {
                if sys::is_not_dir(&e) {
                    error::refused(format!(
                        "{display}: --layout fanout needs DEST to be a real directory (it is a symlink or a file)"
                    ))
                } else {
                    anyhow::Error::new(e).context(format!("cannot open {display}"))
                }
            })
    }

    fn open_live(&self, vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
        symlink::open_live(vol, state)
    }

    fn has_slots(&self) -> bool {
        true
    }

    fn check_dest(&self, vol: &Volume, dest: &Dest) -> Result<()> {
        match dest {
            Dest::Directory | Dest::File => Err(error::refused(format!(
                "{}: {} is not a packsync link; remove it or choose another DEST",
                vol.display,
                sys::os(&vol.name).to_string_lossy()
            ))),
            _ => super::refuse_dest(vol, dest),
        }
    }

    fn check(
        &self,
        vol: &Volume,
        names: &[&[u8]],
        live: Option<&[&[u8]]>,
        adopt: bool,
    ) -> Result<Check> {
        check(vol, names, live, adopt)
    }

    /// Claim the new entries, swap the data link, then make the entry links follow it.
    fn publish(
        &self,
        vol: &Volume,
        state: &State,
        stage: &DirFd,
        gen: &str,
        was_live: Option<&str>,
        opts: &Options,
    ) -> Result<Published> {
        let replaced = symlink::shown_before(vol, was_live);
        claim(vol, &top_level(state, gen)?)?;
        symlink::link(vol, stage, gen, opts)?;
        let warnings = reconcile(vol, state, opts.adopt.then_some(stage))?;
        if opts.fsync {
            vol.parent()?
                .fsync()
                .with_context(|| format!("cannot flush {}", vol.display))?;
        }
        Ok(Published {
            replaced,
            warnings,
            taken_over: None,
        })
    }

    fn repair(&self, vol: &Volume, state: &State, check: &Check) -> Result<Vec<String>> {
        if !check.repair && check.adopt.is_empty() {
            return Ok(Vec::new());
        }
        repair(vol, state, !check.adopt.is_empty())
    }
}

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
        Some(s) => format!("slot {}", c_style(s)),
        None => "the sync without --slot".into(),
    }
}

/// Slots with state at DEST (`base` as `Volume::open` opened it): the
/// unslotted one (`None`) first, then by name.
pub fn slots(base: &Volume) -> Result<Vec<Option<String>>> {
    let dest = base
        .parent()
        .and_then(|p| p.open_dir(&base.name))
        .with_context(|| format!("cannot open {}", base.display))?;
    let listed = || -> io::Result<Vec<Option<String>>> {
        let root = dest.open_dir(STATE)?;
        let mut out = Vec::new();
        if root.exists(b"gen")? {
            out.push(None);
        }
        if let Ok(fd) = root.open_dir(SLOTS) {
            let mut names: Vec<String> = fd
                .list()?
                .into_iter()
                .filter_map(|l| String::from_utf8(l.name).ok())
                .filter(|s| valid_slot(s))
                .collect();
            names.sort();
            out.extend(names.into_iter().map(Some));
        }
        Ok(out)
    };
    listed().with_context(|| format!("cannot list the slots of {}", base.display))
}

/// A listing of `dir` through a handle of its own (a listing reads on from
/// where the last one on the same handle stopped).
fn list(dir: &DirFd) -> io::Result<Vec<sys::Listed>> {
    dir.reopen()?.list()
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
fn owner_for(dest: &DirFd, name: &[u8], mine: &[u8]) -> Result<Owner> {
    Ok(match owner(dest, name)? {
        Owner::Link(link) if link != mine && !dest.exists(&link).unwrap_or(true) => {
            Owner::Foreign { dir: false }
        }
        o => o,
    })
}

fn owner(dest: &DirFd, name: &[u8]) -> Result<Owner> {
    match dest.readlink(name) {
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
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Owner::Absent),
        Err(e) if sys::is_not_symlink(&e) => {
            let dir = dest
                .stat(name)
                .map(|st| sys::kind_of(&st) == sys::StatKind::Dir)
                .unwrap_or(false);
            Ok(Owner::Foreign { dir })
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", c_style(name))),
    }
}

/// Refuse (exit 3) a sync of `vol`'s slot that would publish `names` (the new
/// tree's top-level entries) when another slot owns or claims one of them,
/// or when DEST holds entries packsync did not make and `adopt` is off; and
/// (exit 2) a tree with a name packsync keeps. `live` is the top-level of
/// the slot's live generation, if any. A DEST not made yet holds nothing.
fn check(vol: &Volume, names: &[&[u8]], live: Option<&[&[u8]]>, adopt: bool) -> Result<Check> {
    if let Some(bad) = names.iter().find(|n| reserved(n)) {
        return Err(error::usage(format!(
            "{}: the source has a top-level entry {}, and --layout fanout keeps names starting with .. for itself",
            vol.display,
            c_style(bad)
        )));
    }
    let Ok(dest) = vol.parent() else {
        return Ok(Check::default());
    };
    let want: BTreeSet<&[u8]> = names.iter().copied().collect();
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
            if let Ok(link) = claims.readlink(n) {
                if link != vol.name && claim_holds(vol, &claims, n, &link) {
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
    let mut shown: Vec<String> = names.iter().take(5).map(|n| c_style(n)).collect();
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
        .map(|(n, link)| format!("{} belongs to {}", c_style(n), describe(link)))
        .collect();
    error::refused(format!(
        "{}: {}; an entry can belong to one slot only (nothing was changed)",
        vol.display,
        what.join(", ")
    ))
}

fn open_claims(vol: &Volume, create: bool) -> Option<DirFd> {
    let dest = vol.parent().ok()?;
    if create {
        dest.ensure_dir(STATE, 0o755)
            .and_then(|root| root.ensure_dir(CLAIMS, 0o755))
            .ok()
    } else {
        dest.open_dir(STATE)
            .and_then(|root| root.open_dir(CLAIMS))
            .ok()
    }
}

/// Whether another data link's claim on `name` still stands: its entry link
/// is there, its live generation has the entry, or its slot's state exists
/// and the claim is recent (its writer may be publishing right now).
fn claim_holds(vol: &Volume, claims: &DirFd, name: &[u8], link: &[u8]) -> bool {
    let Ok(dest) = vol.parent() else {
        return false;
    };
    if owner_for(dest, name, b"").ok() == Some(Owner::Link(link.to_vec())) {
        return true;
    }
    let in_live = dest
        .readlink(link)
        .ok()
        .and_then(|t| dest.open_beneath(&t).ok())
        .is_some_and(|g| g.exists(name).unwrap_or(false));
    if in_live {
        return true;
    }
    // A slot removed by hand (its state gone) holds nothing.
    let slot_state = match link.strip_prefix(b"..data-") {
        Some(slot) => [STATE, b"/slots/", slot].concat(),
        None => [STATE, b"/gen"].concat(),
    };
    if dest.open_beneath(&slot_state).is_err() {
        return false;
    }
    claims
        .stat(name)
        .is_ok_and(|st| clock::now_secs() - sys::mtime_of(&st).0 < STALE_STAGE.as_secs() as i64)
}

/// How claiming one name went.
enum Claimed {
    /// Made now, by this sync.
    Made,
    /// This data link's already.
    Ours,
    /// Another data link's, and it stands.
    Held(Vec<u8>),
}

/// Claim every name in `names` for `vol`'s slot, before its data link shows
/// them. Refuses (exit 3), releasing what it claimed, when another slot holds one.
fn claim(vol: &Volume, names: &[Vec<u8>]) -> Result<()> {
    let claims = open_claims(vol, true)
        .with_context(|| format!("cannot create {}/..packsync/claims", vol.display))?;
    let mut made: Vec<&[u8]> = Vec::new();
    let mut conflicts = Vec::new();
    for n in names {
        match claim_one(vol, &claims, n) {
            Ok(Claimed::Made) => made.push(n),
            Ok(Claimed::Ours) => {}
            Ok(Claimed::Held(link)) => conflicts.push((n.clone(), link)),
            Err(e) => {
                release(&claims, &vol.name, &made);
                return Err(e)
                    .with_context(|| format!("cannot claim {} in {}", c_style(n), vol.display));
            }
        }
    }
    // A link of another slot without a claim (claims came later, or were removed by hand).
    let dest = vol.parent()?;
    for n in names {
        if let Owner::Link(link) = owner_for(dest, n, &vol.name)? {
            if link != vol.name && !conflicts.iter().any(|x| &x.0 == n) {
                conflicts.push((n.clone(), link));
            }
        }
    }
    if !conflicts.is_empty() {
        release(&claims, &vol.name, &made);
        return Err(conflict(vol, &conflicts));
    }
    Ok(())
}

/// `symlinkat(claims/<name>)` creates the claim or finds one; a stale one
/// of another slot is replaced in one rename. Asked again when a claim is
/// released between finding it and reading it.
fn claim_one(vol: &Volume, claims: &DirFd, n: &[u8]) -> Result<Claimed> {
    clock::retry(&[0; 8], |_| match claims.symlink(&vol.name, n) {
        Ok(()) => Break(Ok(Claimed::Made)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let Ok(link) = claims.readlink(n) else {
                return Continue(e); // released meanwhile: try again
            };
            if link == vol.name {
                return Break(Ok(Claimed::Ours));
            }
            if claim_holds(vol, claims, n, &link) {
                return Break(Ok(Claimed::Held(link)));
            }
            // Stale: replace it with ours in one rename.
            let tmp = format!("..{}", unique_name());
            Break(
                claims
                    .symlink(&vol.name, tmp.as_bytes())
                    .and_then(|()| claims.rename(tmp.as_bytes(), claims, n))
                    .context("cannot write a claim")
                    .map(|()| Claimed::Made),
            )
        }
        Err(e) => Break(Err(e.into())),
    })?
}

fn release(claims: &DirFd, link: &[u8], names: &[&[u8]]) {
    for n in names {
        if claims.readlink(n).is_ok_and(|l| l == link) {
            let _ = claims.unlink(n);
        }
    }
}

/// The top-level names of `gen` in `state`.
pub fn top_level(state: &State, gen: &str) -> Result<Vec<Vec<u8>>> {
    let fd = state.open_gen(gen)?;
    let mut names: Vec<Vec<u8>> = fd
        .list()
        .with_context(|| format!("cannot list {}/gen/{gen}", state.path.display()))?
        .into_iter()
        .map(|l| l.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Make `vol`'s entry links match the generation its data link shows, until
/// the data link stays put. With `adopt` (a staging directory to build
/// replacements in), entries packsync did not make give way: replaced when
/// the generation has them, removed by the unslotted sync otherwise.
/// Returns warnings (entries it had to leave as they are).
fn reconcile(vol: &Volume, state: &State, adopt: Option<&DirFd>) -> Result<Vec<String>> {
    let settled = clock::retry(&[0; 16], |_| {
        let round = || -> Result<(bool, Vec<String>)> {
            let before = read_link(vol)?;
            let warnings = follow(vol, state, adopt, &before)?;
            Ok((read_link(vol)? == before, warnings))
        };
        match round() {
            Ok((true, warnings)) => Break(Ok(warnings)),
            Ok((false, warnings)) => Continue(warnings),
            Err(e) => Break(Err(e)),
        }
    });
    match settled {
        Ok(r) => r,
        Err(mut warnings) => {
            warnings.push(format!(
                "{}: other writers kept moving {}; their last one sets its links",
                vol.display,
                c_style(&vol.name)
            ));
            Ok(warnings)
        }
    }
}

/// One round of `reconcile`: the links of the tree that the data link text
/// `shown` names.
fn follow(
    vol: &Volume,
    state: &State,
    adopt: Option<&DirFd>,
    shown: &Option<Vec<u8>>,
) -> Result<Vec<String>> {
    let prefix = vol.link_target("");
    let names: BTreeSet<Vec<u8>> = match shown {
        Some(t) => match t.strip_prefix(prefix.as_slice()) {
            Some(gen) => top_level(state, &String::from_utf8_lossy(gen))?
                .into_iter()
                .collect(),
            None => anyhow::bail!(
                "{}: {} is not a packsync link",
                vol.display,
                c_style(&vol.name)
            ),
        },
        None => BTreeSet::new(),
    };
    let claims = open_claims(vol, !names.is_empty());
    unlink_gone(vol, state, adopt.is_some(), &names, claims.as_ref())?;
    link_present(vol, state, adopt, &names, claims.as_ref())
}

/// Links that go: this slot's links to entries its tree no longer has (and,
/// with `adopt`, for the unslotted sync, entries packsync did not make).
fn unlink_gone(
    vol: &Volume,
    state: &State,
    adopt: bool,
    names: &BTreeSet<Vec<u8>>,
    claims: Option<&DirFd>,
) -> Result<()> {
    let dest = vol.parent()?;
    for l in list(dest).with_context(|| format!("cannot list {}", vol.display))? {
        let n = l.name;
        if n == STATE || is_data_link(&n) || names.contains(&n) {
            continue;
        }
        match owner_for(dest, &n, &vol.name)? {
            Owner::Link(link) if link == vol.name => {
                match dest.unlink(&n) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| {
                            format!("cannot remove {}/{}", vol.display, c_style(&n))
                        })
                    }
                    _ => {}
                }
                if let Some(c) = claims {
                    release(c, &vol.name, &[&n]);
                }
            }
            Owner::Foreign { dir } if adopt && vol.slot.is_none() && !(dir && n == LOST_FOUND) => {
                remove_foreign(vol, state, &n)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Links that come: entries of the tree without their link. Returns what
/// it had to leave alone.
fn link_present(
    vol: &Volume,
    state: &State,
    adopt: Option<&DirFd>,
    names: &BTreeSet<Vec<u8>>,
    claims: Option<&DirFd>,
) -> Result<Vec<String>> {
    let dest = vol.parent()?;
    let mut warnings = Vec::new();
    for n in names {
        if let Some(c) = claims {
            let _ = c.symlink(&vol.name, n);
        }
        let mut target = vol.name.clone();
        target.push(b'/');
        target.extend_from_slice(n);
        match owner_for(dest, n, &vol.name)? {
            Owner::Absent => match dest.symlink(&target, n) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot link {}/{}", vol.display, c_style(n)))
                }
            },
            Owner::Link(link) if link == vol.name => {}
            Owner::Link(link) => warnings.push(format!(
                "{}/{}: belongs to {}; not linked",
                vol.display,
                c_style(n),
                describe(&link)
            )),
            Owner::Foreign { dir } => match adopt {
                Some(stage) => replace_foreign(vol, state, stage, n, &target, dir)?,
                None => warnings.push(format!(
                    "{}/{}: not created by packsync; not linked (pass --adopt to replace it)",
                    vol.display,
                    c_style(n)
                )),
            },
        }
    }
    Ok(warnings)
}

fn read_link(vol: &Volume) -> Result<Option<Vec<u8>>> {
    match vol.parent().and_then(|p| p.readlink(&vol.name)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("cannot read {}/{}", vol.display, c_style(&vol.name)))
        }
    }
}

/// Put the link in place of an entry packsync did not make: one rename over a
/// file or link; for a directory, one exchange where the filesystem has it,
/// else move it aside first (the name is missing for an instant).
fn replace_foreign(
    vol: &Volume,
    state: &State,
    stage: &DirFd,
    name: &[u8],
    target: &[u8],
    dir: bool,
) -> Result<()> {
    let dest = vol.parent()?;
    let shown = || format!("{}/{}", vol.display, c_style(name));
    let _ = stage.remove_tree(b"adopt");
    stage
        .symlink(target, b"adopt")
        .context("cannot create a link in staging")?;
    if dir {
        match stage.rename_exchange(b"adopt", dest, name) {
            Ok(()) => {
                let _ = stage.remove_tree(b"adopt");
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                remove_foreign(vol, state, name)?;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot replace {}", shown())),
        }
    }
    stage
        .rename(b"adopt", dest, name)
        .with_context(|| format!("cannot replace {}", shown()))
}

/// Bring `vol`'s entry links in line with its live generation without
/// publishing anything (an up-to-date sync): repairs what a killed writer
/// or a hand edit left, and with `adopt` replaces foreign entries.
fn repair(vol: &Volume, state: &State, adopt: bool) -> Result<Vec<String>> {
    if !adopt {
        return reconcile(vol, state, None);
    }
    let stage = Stage::new(state)?;
    reconcile(vol, state, Some(stage.dir()))
}

/// Move an entry packsync did not make out of DEST and delete it.
fn remove_foreign(vol: &Volume, state: &State, name: &[u8]) -> Result<()> {
    let aside = unique_name();
    vol.parent()
        .and_then(|p| p.rename(name, &state.trash, aside.as_bytes()))
        .with_context(|| format!("cannot remove {}/{}", vol.display, c_style(name)))?;
    // What cannot go yet (files open on NFS) stays in trash/ for a later run.
    let _ = state.trash.remove_tree(aside.as_bytes());
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
