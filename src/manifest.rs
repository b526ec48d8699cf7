//! The on-disk manifest of a generation: one versioned text format, written
//! once when a generation is made and read by status, verify and the next sync.
//!
//! ```text
//! packsync-manifest 1
//! label v1.2.0                  (optional)
//! created 1700000000.123456789
//! host node-a
//! source /opt/packs-image/packs (one line per SOURCE, in order)
//! layers 0 oci-layers%201%20…   (optional: what SOURCE 0's image applied, `Source::record`)
//! owners 1                      (1: owners were mirrored; 0: not compared)
//! granularity 1                 (mtime granularity of the volume, nanoseconds)
//! linkmeta 1                    (1: symlinks got their own mtime and owner; 0: not compared)
//! hardlinks 1                   (1: the volume shows hardlinks as one inode; 0: groups from here)
//! xattrs 1                      (only where some entry carries extended attributes)
//! setmtime 1700000000           (optional: `--set-mtime`, every entry got this mtime)
//! verified 0 SHA256:…           (optional: `--verify-key`, the key that verified SOURCE 0;
//!                                 `keyless:ISSUER:IDENTITY` for a keyless signature)
//! digest <sha256 hex of the entry lines and label>
//! entries 42
//! bytes 123456
//! ---
//! d 0755 0 0 0 1700000000.000000000 - - .
//! f 0644 0 0 12 1700000000.000000000 <sha256> - actions/run.py
//! f 0644 0 0 12 1700000000.000000000 <sha256> 3 lib/a.so        (hardlink group 3)
//! l 0777 0 0 6 1700000000.000000000 - - lib/latest v1.2.0       (symlink and its target)
//! f 0755 0 0 8 1700000000.000000000 <sha256> - bin/ping x:security.capability=0100…
//! ```
//!
//! An entry that carries extended attributes has them as one last field
//! (`xattr::Set::token`); an entry without has no such field, so the
//! manifests of trees without them read as they always did.
//!
//! Paths and targets are escaped so that a line holds no space or newline:
//! every byte outside `!`..`~`, and `%` itself, is written `%HH`. Lines come
//! in pre-order with names sorted bytewise, so a manifest is canonical and
//! its digest names the tree.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::escape::{hex, percent, unpercent};
use crate::tree::{Dir, Entry, File, Meta, Node, Tree};
use crate::xattr::Set;

pub const MAGIC: &str = "packsync-manifest";
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Manifest {
    pub label: Option<String>,
    pub created: (i64, u32),
    pub host: String,
    pub sources: Vec<String>,
    /// Owners were set from the source (root or `--chown`); else not compared.
    pub owners: bool,
    pub granularity_ns: u64,
    /// Symlinks got their own mtime and owner. Where setting them would reach
    /// the target instead (FUSE), they are not set and not compared.
    pub link_meta: bool,
    /// The volume shows hardlinked names as one inode. Where it does not
    /// (sshfs), the live tree's hardlink groups are taken from this manifest.
    pub hardlinks: bool,
    /// Some entry carries extended attributes (the line is written only
    /// then): a listing of the tree, which shows none, is not the tree.
    pub xattrs: bool,
    /// `--set-mtime`: every entry was given this mtime (seconds since the
    /// epoch), so the sources' own mtimes are not in the tree: a source
    /// unchanged since is up to date only under the same value.
    pub set_mtime: Option<i64>,
    /// (SOURCE index, record): what a source kind keeps so that the next
    /// sync can start from this generation (an image's applied layers,
    /// `Source::record`). Not part of the digest; a malformed line is
    /// ignored (it only costs that shortcut).
    pub layers: Vec<(usize, String)>,
    /// (SOURCE index, key fingerprint): `--verify-key`, the key whose
    /// signature each source carried. Part of the digest when present (a
    /// tree published verified is another generation than the same tree
    /// unverified); manifests without it read and digest as before.
    pub verified: Vec<(usize, String)>,
    pub digest: String,
    pub tree: Tree,
}

fn unhex(s: &str) -> Result<[u8; 32]> {
    // Every manifest line of a file has one: read a nibble at a time.
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    let mut out = [0u8; 32];
    if b.len() != 64 {
        bail!("bad sha256 {s:?}");
    }
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => bail!("bad sha256 {s:?}"),
        }
    }
    Ok(out)
}

pub(crate) fn entry_line(out: &mut String, path: &[u8], e: &Entry) {
    use std::fmt::Write;
    let m = &e.meta;
    let (hash, group) = match &e.node {
        Node::File(f) => (
            f.hash.map(|h| hex(&h)).unwrap_or_else(|| "-".into()),
            f.group.map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
        ),
        _ => ("-".into(), "-".into()),
    };
    let _ = write!(
        out,
        "{} {:04o} {} {} {} {}.{:09} {} {} {}",
        e.kind().letter(),
        m.mode,
        m.uid,
        m.gid,
        m.size,
        { m.mtime.s },
        { m.mtime.ns },
        hash,
        group,
        percent(path)
    );
    if let Node::Symlink(t) = &e.node {
        out.push(' ');
        out.push_str(&percent(t));
    }
    if let Some(x) = m.xattrs.token() {
        out.push(' ');
        out.push_str(&x);
    }
    out.push('\n');
}

/// Call `f` with each canonical entry line of a tree (the part after `---`),
/// one at a time, so that no copy of the whole body is ever held.
pub fn for_each_line(tree: &Tree, f: &mut dyn FnMut(&str)) {
    let mut line = String::new();
    let root = Entry {
        name: Default::default(),
        meta: tree.root,
        node: Node::Dir(Dir::default()),
    };
    entry_line(&mut line, b".", &root);
    f(&line);
    tree.for_each(&mut |p, e| {
        line.clear();
        entry_line(&mut line, p, e);
        f(&line);
    });
}

/// The digest that names a tree: entry lines plus label, plus the
/// `verified` records where there are any.
pub fn digest(tree: &Tree, label: Option<&str>, verified: &[(usize, String)]) -> String {
    let mut h = Sha256::new();
    for_each_line(tree, &mut |l| h.update(l.as_bytes()));
    sealed(h, label, verified)
}

/// The digest of entry lines hashed into `h`: their label, then the
/// `verified` records, hashed after them.
fn sealed(mut h: Sha256, label: Option<&str>, verified: &[(usize, String)]) -> String {
    h.update(b"label ");
    h.update(label.unwrap_or("").as_bytes());
    for (i, fp) in verified {
        h.update(format!("\nverified {i} {}", percent(fp.as_bytes())).as_bytes());
    }
    hex(&h.finalize())
}

impl Manifest {
    /// Fill in `digest` from the tree and label; returns the text to write.
    pub fn seal(&mut self) -> String {
        let mut out = Vec::new();
        self.write(&mut out).expect("writing to memory");
        String::from_utf8(out).expect("manifests are ASCII")
    }

    /// Fill in `digest` and write the manifest to `w`, a line at a time.
    pub fn write(&mut self, w: &mut dyn Write) -> std::io::Result<()> {
        self.digest = digest(&self.tree, self.label.as_deref(), &self.verified);
        self.write_header(w, self.tree.count(), self.tree.bytes())?;
        let mut res = Ok(());
        for_each_line(&self.tree, &mut |l| {
            if res.is_ok() {
                res = w.write_all(l.as_bytes());
            }
        });
        res
    }

    /// The header, up to and including `---`, with `digest` as it is and
    /// the counts given (a streamed body's: `Spooled`).
    /// Write the manifest whose body a stage spooled (`spooled`, what
    /// `assemble` wrote; `body`, a reader of it): its digest is the body's,
    /// the header first, then the body as written.
    pub fn write_spooled(
        &mut self,
        w: &mut dyn Write,
        spooled: &Spooled,
        body: &mut dyn std::io::Read,
    ) -> std::io::Result<()> {
        self.digest = spooled.digest(self.label.as_deref(), &self.verified);
        self.write_header(w, spooled.entries, spooled.bytes)?;
        std::io::copy(body, w)?;
        Ok(())
    }

    pub fn write_header(&self, w: &mut dyn Write, entries: u64, bytes: u64) -> std::io::Result<()> {
        writeln!(w, "{MAGIC} {VERSION}")?;
        if let Some(l) = &self.label {
            writeln!(w, "label {}", percent(l.as_bytes()))?;
        }
        writeln!(w, "created {}.{:09}", self.created.0, self.created.1)?;
        writeln!(w, "host {}", percent(self.host.as_bytes()))?;
        for s in &self.sources {
            writeln!(w, "source {}", percent(s.as_bytes()))?;
        }
        for (i, r) in &self.layers {
            writeln!(w, "layers {i} {}", percent(r.as_bytes()))?;
        }
        writeln!(w, "owners {}", self.owners as u8)?;
        writeln!(w, "granularity {}", self.granularity_ns)?;
        writeln!(w, "linkmeta {}", self.link_meta as u8)?;
        writeln!(w, "hardlinks {}", self.hardlinks as u8)?;
        if self.xattrs {
            writeln!(w, "xattrs 1")?;
        }
        if let Some(t) = self.set_mtime {
            writeln!(w, "setmtime {t}")?;
        }
        for (i, fp) in &self.verified {
            writeln!(w, "verified {i} {}", percent(fp.as_bytes()))?;
        }
        writeln!(w, "digest {}", self.digest)?;
        writeln!(w, "entries {entries}")?;
        writeln!(w, "bytes {bytes}")?;
        writeln!(w, "---")
    }

    /// Read a manifest: its header, then its entries into `tree`.
    pub fn read(r: &mut dyn BufRead) -> Result<Manifest> {
        let mut m = Manifest::read_header(r)?;
        for_each_entry(r, &mut |path, e| insert(&mut m.tree, path, e))?;
        if m.tree.root_srcs == 0 {
            bail!("manifest has no entries (not even its root): truncated");
        }
        Ok(m)
    }

    /// A manifest's body alone (its entries, the root's line first) as a tree.
    pub fn read_body(r: &mut dyn BufRead) -> Result<Tree> {
        let mut tree = Tree::default();
        for_each_entry(r, &mut |path, e| insert(&mut tree, path, e))?;
        Ok(tree)
    }

    /// Read a whole manifest and check it against its own digest: one cut
    /// short (a power loss after a `--no-fsync` sync leaves it empty) or
    /// edited is refused, never taken for the tree it names.
    pub fn read_checked(r: &mut dyn BufRead) -> Result<Manifest> {
        let m = Manifest::read(r)?;
        if digest(&m.tree, m.label.as_deref(), &m.verified) != m.digest {
            bail!("the manifest does not match its digest (cut short or edited)");
        }
        Ok(m)
    }

    /// Whether the entries `r` holds after the header (`self`, its header,
    /// read from it) match the header's digest, read one at a time with no
    /// tree held (`LineDigest`): the root first, the paths in pre-order,
    /// each line as `read_checked` would check it. `false` where they do
    /// not (or do not read): `read_checked` then says why.
    pub fn digest_matches(&self, r: &mut dyn BufRead) -> bool {
        let mut d = LineDigest::default();
        let read = for_each_entry(r, &mut |path, e| match d.entry(&path, &e) {
            true => Ok(()),
            false => bail!("out of order"),
        });
        read.is_ok() && d.matches(self)
    }

    /// Read the header, up to and including `---`; the tree is left empty.
    pub fn read_header(r: &mut dyn BufRead) -> Result<Manifest> {
        let mut first = String::new();
        r.read_line(&mut first)?;
        let version = first
            .trim_end()
            .strip_prefix(MAGIC)
            .map(str::trim)
            .context("not a packsync manifest")?
            .parse::<u32>()
            .context("bad manifest version")?;
        if version != VERSION {
            bail!("manifest version {version} is not supported (this packsync reads {VERSION})");
        }
        // Manifests without these lines were made where everything held.
        let mut m = Manifest {
            granularity_ns: 1,
            link_meta: true,
            hardlinks: true,
            ..Default::default()
        };
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                break;
            }
            let line = line.trim_end_matches('\n');
            if line == "---" {
                break;
            }
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            let text =
                || -> Result<String> { Ok(String::from_utf8_lossy(&unpercent(v)?).into_owned()) };
            match k {
                "label" => m.label = Some(text()?),
                "created" => m.created = parse_time(v)?,
                "host" => m.host = text()?,
                "source" => m.sources.push(text()?),
                "layers" => {
                    if let Some(r) = layers_line(v) {
                        m.layers.push(r);
                    }
                }
                "owners" => m.owners = v == "1",
                "granularity" => m.granularity_ns = v.parse().context("bad granularity")?,
                "linkmeta" => m.link_meta = flag(v).context("bad linkmeta")?,
                "hardlinks" => m.hardlinks = flag(v).context("bad hardlinks")?,
                "xattrs" => m.xattrs = flag(v).context("bad xattrs")?,
                "setmtime" => m.set_mtime = Some(v.parse().context("bad setmtime")?),
                "verified" => {
                    let (i, fp) = v.split_once(' ').context("bad verified")?;
                    let i: u16 = i.parse().context("bad verified")?;
                    m.verified.push((
                        i.into(),
                        String::from_utf8_lossy(&unpercent(fp)?).into_owned(),
                    ));
                }
                "digest" => m.digest = v.to_string(),
                _ => {} // counts and fields of later minor versions
            }
        }
        Ok(m)
    }

    pub fn parse(text: &str) -> Result<Manifest> {
        Manifest::read(&mut text.as_bytes())
    }

    /// The record kept for SOURCE `i` (`layers` lines), if any.
    pub fn layers_of(&self, i: usize) -> Option<&str> {
        self.layers
            .iter()
            .find(|(at, _)| *at == i)
            .map(|(_, r)| r.as_str())
    }
}

/// Longest `layers` record taken, unescaped (a thousand layers fit).
pub const MAX_LAYERS_RECORD: usize = 96 << 10;

/// `<index> <escaped record>`, or `None` if malformed (ignored).
fn layers_line(v: &str) -> Option<(usize, String)> {
    if v.len() > 3 * MAX_LAYERS_RECORD + 8 {
        return None;
    }
    let (i, r) = v.split_once(' ')?;
    let i: u16 = i.parse().ok()?;
    let r = String::from_utf8(unpercent(r).ok()?).ok()?;
    (r.len() <= MAX_LAYERS_RECORD).then_some((i.into(), r))
}

/// A manifest body written a directory at a time, in whatever order the
/// directories were done: each directory's fragment (the lines of its own
/// entries, in name order) is appended to one spool file and indexed by the
/// directory's escaped path. `assemble` puts the fragments in pre-order.
/// A fragment line is `K LINE`, where `K` is `-` or, for a file of more than
/// one link, `dev:ino`: whether it is a hardlink group, and which path of
/// it comes first (and keeps the hash), is known only once every directory
/// is done; such a line's hash is the inode's in `hashes`.
#[derive(Default)]
pub struct Fragments {
    /// Escaped directory path (empty: the root) → (offset, length).
    pub index: FragmentIndex,
    /// Paths of each multiply-linked inode inside the tree.
    pub links: std::collections::HashMap<Inode, u32>,
    /// The content hash of each multiply-linked inode, from its copy.
    pub hashes: std::collections::HashMap<Inode, [u8; 32]>,
    /// Every path of a group keeps the hash its line has, not only the
    /// first: a tree read as it is on the volume, every file hashed (a
    /// directory taken over at DEST, as `verify::read` recorded it).
    pub hash_every_path: bool,
}

/// A source inode: (dev, ino).
pub type Inode = (u64, u64);

/// Where each directory's fragment is: its key (the escaped path) and
/// (offset, length), 24 bytes and the key per directory, sorted by key
/// once every directory is done (`sort`) and then found by binary search.
#[derive(Default)]
pub struct FragmentIndex {
    keys: Vec<u8>,
    /// (key offset, key length, offset, length).
    recs: Vec<(u64, u32, u64, u32)>,
    sorted: bool,
}

impl FragmentIndex {
    /// Room for `dirs` directories whose keys take `key_bytes`, where
    /// that is known (an update: the live tree's), so that growing by
    /// doubling leaves no slack.
    pub fn reserve(&mut self, dirs: usize, key_bytes: usize) {
        self.recs.reserve_exact(dirs);
        self.keys.reserve_exact(key_bytes);
    }

    pub fn insert(&mut self, key: &[u8], at: (u64, u32)) {
        self.recs
            .push((self.keys.len() as u64, key.len() as u32, at.0, at.1));
        self.keys.extend_from_slice(key);
        self.sorted = false;
    }

    fn key(&self, r: &(u64, u32, u64, u32)) -> &[u8] {
        &self.keys[r.0 as usize..r.0 as usize + r.1 as usize]
    }

    fn sort(&mut self) {
        let mut recs = std::mem::take(&mut self.recs);
        recs.sort_by(|a, b| self.key(a).cmp(self.key(b)));
        self.recs = recs;
        self.sorted = true;
    }

    /// The fragment of `key`; `sort` first.
    fn get(&self, key: &[u8]) -> Option<(u64, u32)> {
        debug_assert!(self.sorted);
        let i = self.recs.binary_search_by(|r| self.key(r).cmp(key)).ok()?;
        let r = &self.recs[i];
        Some((r.2, r.3))
    }
}

/// A manifest's digest taken a line at a time as its entries are read
/// (`entry`, each once, in the order read), as `digest` takes it over a
/// whole tree; the order `read_checked` requires is checked on the way:
/// the root first, then every path in pre-order.
#[derive(Default)]
pub struct LineDigest {
    h: Sha256,
    line: String,
    prev: Option<Vec<u8>>,
    in_order: bool,
}

impl LineDigest {
    /// Take the entry at `path`; `false` once the order is broken.
    pub fn entry(&mut self, path: &[u8], e: &Entry) -> bool {
        let in_order = match &self.prev {
            None => path == b".",
            Some(p) if p == b"." => path != b".",
            Some(p) => cmp_preorder(p, path) == std::cmp::Ordering::Less,
        };
        self.in_order = in_order && (self.prev.is_none() || self.in_order);
        self.line.clear();
        entry_line(&mut self.line, path, e);
        self.h.update(self.line.as_bytes());
        self.prev = Some(path.to_vec());
        self.in_order
    }

    /// Whether the entries taken, in order and at least the root, give
    /// the digest `header` records (with its label and `verified` records).
    pub fn matches(self, header: &Manifest) -> bool {
        if self.prev.is_none() || !self.in_order {
            return false;
        }
        sealed(self.h, header.label.as_deref(), &header.verified) == header.digest
    }
}

/// One directory's entries (`rel` its path) as fragment lines: `dev:ino`
/// before each file of more than one link where `keyed` (the volume shows
/// hardlinks), `-` before the others.
pub fn fragment_text(rel: &[u8], entries: &[Entry], keyed: bool) -> String {
    let mut text = String::new();
    let mut line = String::new();
    for e in entries {
        let path = crate::tree::join(rel, &e.name);
        match &e.node {
            Node::File(f) if keyed && f.nlink > 1 => {
                text.push_str(&format!("{}:{} ", f.dev, f.ino));
            }
            _ => text.push_str("- "),
        }
        line.clear();
        entry_line(&mut line, &path, e);
        text.push_str(&line);
    }
    text
}

/// The spool file of a body written a directory at a time (`lines` in a
/// staging directory) and its length: each directory's fragment is
/// appended and indexed (`append`), then the body assembled from it in
/// pre-order (`assemble_spool`).
pub struct LineSpool {
    file: std::sync::Mutex<(std::os::fd::OwnedFd, u64)>,
}

impl LineSpool {
    /// The spool on `fd`, a file just made, opened for writing.
    pub fn new(fd: std::os::fd::OwnedFd) -> LineSpool {
        LineSpool {
            file: std::sync::Mutex::new((fd, 0)),
        }
    }

    /// Append the fragment `text` of the directory at `rel`, indexed in `frags`.
    pub fn append(
        &self,
        frags: &std::sync::Mutex<Fragments>,
        rel: &[u8],
        text: &str,
    ) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        let mut spool = self.file.lock().unwrap();
        crate::sys::write_all(spool.0.as_fd(), text.as_bytes())?;
        let off = spool.1;
        spool.1 += text.len() as u64;
        drop(spool);
        let key = if rel.is_empty() {
            Vec::new()
        } else {
            percent(rel).into_bytes()
        };
        frags
            .lock()
            .unwrap()
            .index
            .insert(&key, (off, text.len() as u32));
        Ok(())
    }
}

/// `assemble`, the fragments read back from the spool `lines` (opened for
/// reading) by position.
pub fn assemble_spool(
    root: &Entry,
    frags: &mut Fragments,
    lines: std::os::fd::BorrowedFd<'_>,
    w: &mut dyn Write,
) -> Result<Spooled> {
    let read = |off: u64, len: u32| -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let mut got = 0;
        while got < buf.len() {
            let n = crate::sys::pread(lines, &mut buf[got..], off + got as u64)?;
            if n == 0 {
                return Err(std::io::Error::other("staged lines cut short"));
            }
            got += n;
        }
        Ok(buf)
    };
    assemble(root, frags, &read, w)
}

/// What `assemble` wrote.
pub struct Spooled {
    /// Its entry lines hashed: the digest but for the header's label and
    /// `verified` records (`digest`).
    lines: Sha256,
    pub entries: u64,
    pub bytes: u64,
}

impl Spooled {
    /// The digest of a manifest of this body with `label` and `verified`:
    /// what `digest` computes for the same tree.
    pub fn digest(&self, label: Option<&str>, verified: &[(usize, String)]) -> String {
        sealed(self.lines.clone(), label, verified)
    }
}

/// Write the body of a manifest whose fragments `read` hands out (by
/// offset and length) in pre-order to `w`, after the root's own line:
/// hardlink groups numbered in the order they first appear, the hash kept
/// on that first path only, as `for_each_line` writes them. The digest is
/// the one `digest` computes for the same tree (`Spooled::digest`).
pub fn assemble(
    root: &Entry,
    frags: &mut Fragments,
    read: &dyn Fn(u64, u32) -> std::io::Result<Vec<u8>>,
    w: &mut dyn Write,
) -> Result<Spooled> {
    frags.index.sort();
    let frags = &*frags;
    let mut h = Sha256::new();
    let mut line = String::new();
    entry_line(&mut line, b".", root);
    h.update(line.as_bytes());
    w.write_all(line.as_bytes())?;
    let mut a = Assembly {
        frags,
        read,
        h,
        w,
        groups: std::collections::HashMap::new(),
        entries: 0,
        bytes: 0,
    };
    a.dir(b"")?;
    Ok(Spooled {
        lines: a.h,
        entries: a.entries,
        bytes: a.bytes,
    })
}

struct Assembly<'a> {
    frags: &'a Fragments,
    read: &'a dyn Fn(u64, u32) -> std::io::Result<Vec<u8>>,
    h: Sha256,
    w: &'a mut dyn Write,
    /// Group number of each multiply-linked inode met so far.
    groups: std::collections::HashMap<Inode, u32>,
    entries: u64,
    bytes: u64,
}

impl Assembly<'_> {
    fn dir(&mut self, path: &[u8]) -> Result<()> {
        let (off, len) =
            self.frags.index.get(path).with_context(|| {
                format!("no staged lines for {}", String::from_utf8_lossy(path))
            })?;
        let text = (self.read)(off, len)?;
        for raw in text.split_inclusive(|&b| b == b'\n') {
            let (key, line) = split_key(raw).context("bad staged line")?;
            let mut f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            if f.len() < 9 {
                bail!("bad staged line");
            }
            let kind = f[0];
            let mut size: u64 = std::str::from_utf8(f[4])?.parse()?;
            let (group, hash);
            let paths = key.map(|k| (k, self.frags.links.get(&k).copied().unwrap_or(0)));
            match paths {
                Some((k, n)) if n > 1 => {
                    let next = self.groups.len() as u32;
                    let id = *self.groups.entry(k).or_insert(next);
                    if id == next {
                        let h = self
                            .frags
                            .hashes
                            .get(&k)
                            .context("a hardlinked file without a hash")?;
                        hash = hex(h);
                        f[6] = hash.as_bytes();
                    } else {
                        if !self.frags.hash_every_path {
                            f[6] = b"-";
                        }
                        size = 0;
                    }
                    group = id.to_string();
                    f[7] = group.as_bytes();
                }
                // Its other links are outside the tree: the hash it was
                // staged with, known after its line was written where it
                // was placed last (`stage::stream`).
                Some((k, _)) => {
                    if let Some(h) = self.frags.hashes.get(&k) {
                        hash = hex(h);
                        f[6] = hash.as_bytes();
                    }
                }
                None => {}
            }
            let out = f.join(&b' ');
            self.h.update(&out);
            self.w.write_all(&out)?;
            self.entries += 1;
            if kind == b"f" {
                self.bytes += size;
            }
            if kind == b"d" {
                let p = f[8].strip_suffix(b"\n").unwrap_or(f[8]);
                self.dir(p)?;
            }
        }
        Ok(())
    }
}

/// `K LINE` → (the inode of `K`, `LINE`).
fn split_key(raw: &[u8]) -> Option<(Option<Inode>, &[u8])> {
    let sp = raw.iter().position(|&b| b == b' ')?;
    let (k, line) = (&raw[..sp], &raw[sp + 1..]);
    if k == b"-" {
        return Some((None, line));
    }
    let k = std::str::from_utf8(k).ok()?;
    let (dev, ino) = k.split_once(':')?;
    Some((Some((dev.parse().ok()?, ino.parse().ok()?)), line))
}

/// Reads the entries after the header one at a time, in pre-order.
pub struct Entries<'r> {
    r: &'r mut dyn BufRead,
    line: String,
    n: u64,
}

impl<'r> Entries<'r> {
    pub fn new(r: &'r mut dyn BufRead) -> Entries<'r> {
        Entries {
            r,
            line: String::new(),
            n: 0,
        }
    }

    /// The next (path, entry without children); `None` at the end.
    pub fn next_entry(&mut self) -> Result<Option<(Vec<u8>, Entry)>> {
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            return Ok(None);
        }
        self.n += 1;
        let n = self.n;
        parse_entry(self.line.trim_end_matches('\n'))
            .map(Some)
            .with_context(|| format!("manifest entry line {n}"))
    }
}

/// Call `f` with each entry after the header (path, entry without children), in order.
pub fn for_each_entry(
    r: &mut dyn BufRead,
    f: &mut dyn FnMut(Vec<u8>, Entry) -> Result<()>,
) -> Result<()> {
    let mut entries = Entries::new(r);
    while let Some((path, e)) = entries.next_entry()? {
        f(path, e)?;
    }
    Ok(())
}

fn flag(v: &str) -> Result<bool> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => bail!("expected 0 or 1, found {v:?}"),
    }
}

fn parse_time(s: &str) -> Result<(i64, u32)> {
    let (a, b) = s.split_once('.').unwrap_or((s, "0"));
    // A fraction of a second, as written: `.5` is half a second, never 5 ns.
    if b.is_empty() || b.len() > 9 || !b.bytes().all(|c| c.is_ascii_digit()) {
        bail!("bad time {s:?}");
    }
    let ns = b.parse::<u32>().context("bad time")? * 10u32.pow(9 - b.len() as u32);
    Ok((a.parse().context("bad time")?, ns))
}

pub(crate) fn parse_entry(line: &str) -> Result<(Vec<u8>, Entry)> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() < 9 {
        bail!("too few fields");
    }
    let meta = Meta {
        mode: u32::from_str_radix(f[1], 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .context("bad mode")?,
        uid: f[2].parse().context("bad uid")?,
        gid: f[3].parse().context("bad gid")?,
        size: f[4].parse().context("bad size")?,
        mtime: parse_time(f[5])?.into(),
        xattrs: Default::default(),
    };
    let mut meta = meta;
    let fixed = if f[0] == "l" { 10 } else { 9 };
    match f.get(fixed) {
        None => {}
        Some(x) if f.len() == fixed + 1 => meta.xattrs = Set::parse(x)?,
        Some(_) => bail!("too many fields"),
    }
    let path = unpercent(f[8])?;
    let node = match f[0] {
        "f" => Node::File(File {
            hash: if f[6] == "-" {
                None
            } else {
                Some(unhex(f[6])?)
            },
            group: if f[7] == "-" {
                None
            } else {
                Some(f[7].parse().context("bad group")?)
            },
            ..Default::default()
        }),
        "d" => Node::Dir(Dir {
            srcs: 1,
            entries: Vec::new(),
        }),
        "l" => Node::Symlink(unpercent(f.get(9).context("symlink without target")?)?.into()),
        k => bail!("unknown kind {k:?}"),
    };
    // Every component a name a directory can hold: nothing a handle-relative
    // walk would refuse or take out of the tree.
    let name: &[u8] = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
    if path != b"."
        && path
            .split(|&b| b == b'/')
            .any(|c| c.is_empty() || c == b"." || c == b".." || c.contains(&0))
    {
        bail!("bad path {:?}", percent(&path));
    }
    let name = name.into();
    Ok((path, Entry { name, meta, node }))
}

/// Put an entry read in pre-order into `tree`.
fn insert(tree: &mut Tree, path: Vec<u8>, e: Entry) -> Result<()> {
    match (path == b".", tree.root_srcs == 0) {
        (true, true) => {
            tree.root = e.meta;
            tree.root_srcs = 1;
            return Ok(());
        }
        (true, false) => bail!("the root twice"),
        (false, true) => bail!("entry before the root"),
        (false, false) => {}
    }
    let mut parts = path.split(|&b| b == b'/').peekable();
    let mut dir = &mut tree.entries;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            // Names sorted bytewise, each once: trees are compared by merge walks.
            if dir.last().is_some_and(|last| *last.name >= *e.name) {
                bail!("entry out of order or twice");
            }
            dir.push(e);
            return Ok(());
        }
        // Pre-order: the parent is the last entry pushed at its level.
        match dir.last_mut() {
            Some(Entry {
                name,
                node: Node::Dir(d),
                ..
            }) if &**name == part => dir = &mut d.entries,
            _ => bail!("entry before its directory"),
        }
    }
    bail!("empty path")
}

/// Order of two relative paths in a pre-order walk with names sorted bytewise.
pub fn cmp_preorder(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|&c| c == b'/').cmp(b.split(|&c| c == b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips() {
        let file = |name: &[u8], hash: u8, group| Entry {
            name: name.into(),
            meta: Meta {
                mode: 0o4755,
                uid: 1,
                gid: 2,
                size: 3,
                mtime: (1_700_000_000, 123_456_789).into(),
                xattrs: crate::xattr::Set::of(vec![
                    (b"security.capability".to_vec(), vec![1, 0, 0, 2]),
                    (b"user.a b".to_vec(), b"x\ny".to_vec()),
                ]),
            },
            node: Node::File(File {
                hash: Some([hash; 32]),
                group,
                ..Default::default()
            }),
        };
        let tree = Tree {
            root: Meta {
                mode: 0o755,
                mtime: (5, 6).into(),
                ..Default::default()
            },
            root_srcs: 1,
            entries: vec![
                Entry {
                    name: b"a dir\n".as_slice().into(),
                    meta: Meta {
                        mode: 0o1777,
                        ..Default::default()
                    },
                    node: Node::Dir(Dir {
                        srcs: 1,
                        entries: vec![file(b"x", 1, Some(0)), file(b"\xff%y", 2, None)],
                    }),
                },
                Entry {
                    name: b"link".as_slice().into(),
                    meta: Meta {
                        mode: 0o777,
                        size: 9,
                        ..Default::default()
                    },
                    node: Node::Symlink(b"../x/../..".as_slice().into()),
                },
                file(b"z", 1, Some(0)),
            ],
        };
        let mut m = Manifest {
            label: Some("v1.2 beta".into()),
            created: (10, 20),
            host: "h".into(),
            sources: vec!["/a b".into()],
            owners: true,
            granularity_ns: 1000,
            link_meta: false,
            hardlinks: false,
            xattrs: true,
            set_mtime: Some(-86400),
            layers: vec![(0, "oci-layers 1 x".into())],
            verified: vec![(0, "SHA256:ab+/c".into())],
            digest: String::new(),
            tree,
        };
        let text = m.seal();
        assert!(
            text.contains("\nlinkmeta 0\nhardlinks 0\nxattrs 1\nsetmtime -86400\n"),
            "{text}"
        );
        assert!(
            text.contains(" x:security.capability=01000002;user.a%20b=780a79\n"),
            "{text}"
        );
        let back = Manifest::parse(&text).unwrap();
        assert_eq!(back, m);
        // And the other way round.
        let mut all = m.clone();
        (all.link_meta, all.hardlinks) = (true, true);
        assert_eq!(Manifest::parse(&all.seal()).unwrap(), all);
        assert_eq!(back.digest.len(), 64);
        // The digest names the content: another label, another digest.
        let mut other = m.clone();
        other.label = None;
        other.seal();
        assert_ne!(other.digest, m.digest);
        // So does the key that verified it; without one, the digest is the
        // tree's and label's alone, as before `verified` lines.
        let mut unverified = m.clone();
        unverified.verified.clear();
        let plain = unverified.seal();
        assert!(!plain.contains("verified"), "{plain}");
        assert_ne!(unverified.digest, m.digest);
        assert_eq!(unverified.digest, digest(&m.tree, m.label.as_deref(), &[]));
        // Written in pieces or at once, the same bytes.
        let mut streamed = Vec::new();
        m.write(&mut streamed).unwrap();
        assert_eq!(streamed, text.as_bytes());
        // Checked a line at a time, as `read_checked` checks it whole.
        let matches = |text: &str| {
            let mut r = text.as_bytes();
            let header = Manifest::read_header(&mut r).unwrap();
            let streaming = header.digest_matches(&mut r);
            assert_eq!(
                streaming,
                Manifest::read_checked(&mut text.as_bytes()).is_ok(),
                "{text}"
            );
            streaming
        };
        assert!(matches(&text));
        assert!(matches(&plain));
        let edited = text.replacen(&"01".repeat(32), &"02".repeat(32), 1);
        assert_ne!(edited, text);
        assert!(!matches(&edited), "an edited line");
        let cut = &text[..text.rfind("\nl ").unwrap() + 1];
        assert!(!matches(cut), "cut short at a line");
        // Two lines swapped, and the digest made for that order.
        let lines: Vec<&str> = text.lines().collect();
        let (x, z) = (
            lines.iter().position(|l| l.contains(" 0 z ")).unwrap(),
            lines.iter().position(|l| l.contains(" link")).unwrap(),
        );
        // The manifest of `lines` with the digest its body gives.
        let forge = |lines: &[&str]| -> String {
            let body: String = lines[lines.iter().position(|l| *l == "---").unwrap() + 1..]
                .iter()
                .map(|l| format!("{l}\n"))
                .collect();
            let mut h = Sha256::new();
            h.update(body.as_bytes());
            h.update(b"label v1.2 beta");
            h.update(b"\nverified 0 SHA256:ab+/c");
            lines
                .iter()
                .map(|l| match l.strip_prefix("digest ") {
                    Some(_) => format!("digest {}\n", hex(&h.clone().finalize())),
                    None => format!("{l}\n"),
                })
                .collect()
        };
        assert_eq!(forge(&lines), text, "the digest as `seal` computes it");
        let mut swapped = lines.clone();
        swapped.swap(x, z);
        let forged = forge(&swapped);
        assert!(!matches(&forged), "out of order, whatever its digest");
    }

    #[test]
    fn fragments_in_any_order_assemble_to_the_body_and_digest_of_the_tree() {
        // Files 1..: (name, inode, links); inode 7 has three paths in three
        // directories, inode 8 one path here and one outside the tree.
        let file = |name: &str, ino: u64, nlink: u32| Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o644,
                size: ino,
                mtime: (ino as i64, 5).into(),
                ..Default::default()
            },
            node: Node::File(File {
                dev: 1,
                ino,
                nlink,
                hash: Some([ino as u8; 32]),
                ..Default::default()
            }),
        };
        let dir = |name: &str, entries: Vec<Entry>| Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o755,
                ..Default::default()
            },
            node: Node::Dir(Dir { srcs: 1, entries }),
        };
        let mut tree = Tree {
            root: Meta {
                mode: 0o755,
                ..Default::default()
            },
            root_srcs: 1,
            entries: vec![
                dir(
                    "a",
                    vec![file("x", 7, 3), dir("b c", vec![file("y", 9, 1)])],
                ),
                dir("a-b", vec![file("z", 7, 3)]),
                Entry {
                    name: b"l".as_slice().into(),
                    meta: Meta::default(),
                    node: Node::Symlink(b"a/x".as_slice().into()),
                },
                file("one", 8, 2),
                file("w", 7, 3),
            ],
        };
        tree.assign_groups();
        // What staging writes: later links without a hash (the whole-tree
        // path never hashes them either).
        let mut leaders = std::collections::HashSet::new();
        tree.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                if f.group.is_some_and(|g| !leaders.insert(g)) {
                    f.hash = None;
                }
            }
        });
        let mut want = Vec::new();
        for_each_line(&tree, &mut |l| want.extend_from_slice(l.as_bytes()));

        // Fragments as `stage::stream` writes them, deepest directory first,
        // the copy of inode 7 made at its last path (`w`).
        let mut spool = Vec::new();
        let mut frags = Fragments::default();
        let mut dirs: Vec<(Vec<u8>, Vec<Entry>)> = vec![(Vec::new(), tree.entries.clone())];
        tree.for_each(&mut |p, e| {
            if let Node::Dir(d) = &e.node {
                dirs.push((p.to_vec(), d.entries.clone()));
            }
        });
        for (rel, entries) in dirs.iter().rev() {
            let off = spool.len() as u64;
            for e in entries {
                let mut e = e.clone();
                let path = if rel.is_empty() {
                    e.name.to_vec()
                } else {
                    [rel.as_slice(), b"/", &e.name].concat()
                };
                if let Node::File(f) = &mut e.node {
                    if f.nlink > 1 {
                        *frags.links.entry((f.dev, f.ino)).or_default() += 1;
                        spool.extend_from_slice(format!("{}:{} ", f.dev, f.ino).as_bytes());
                        f.hash = (path == b"w" || f.ino != 7).then_some([f.ino as u8; 32]);
                        if let Some(h) = f.hash {
                            frags.hashes.insert((f.dev, f.ino), h);
                        }
                    } else {
                        spool.extend_from_slice(b"- ");
                    }
                    f.group = None;
                } else {
                    spool.extend_from_slice(b"- ");
                }
                let mut line = String::new();
                entry_line(&mut line, &path, &e);
                spool.extend_from_slice(line.as_bytes());
            }
            let key = percent(rel).into_bytes();
            frags
                .index
                .insert(&key, (off, (spool.len() as u64 - off) as u32));
        }
        let read = |off: u64, len: u32| Ok(spool[off as usize..][..len as usize].to_vec());
        let root = Entry {
            name: Default::default(),
            meta: tree.root,
            node: Node::Dir(Dir::default()),
        };
        let mut got = Vec::new();
        let body = assemble(&root, &mut frags, &read, &mut got).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(want).unwrap()
        );
        assert_eq!(body.digest(Some("v1"), &[]), digest(&tree, Some("v1"), &[]));
        let verified = [(0, "SHA256:ab+/c".to_string())];
        assert_eq!(body.digest(None, &verified), digest(&tree, None, &verified));
        assert_eq!((body.entries, body.bytes), (tree.count(), tree.bytes()));
    }

    #[test]
    fn preorder_puts_children_right_after_their_directory() {
        use std::cmp::Ordering::*;
        assert_eq!(cmp_preorder(b"a/b", b"a-c"), Less);
        assert_eq!(cmp_preorder(b"a", b"a/b"), Less);
        assert_eq!(cmp_preorder(b"a/z", b"b"), Less);
        assert_eq!(cmp_preorder(b"x", b"x"), Equal);
    }

    #[test]
    fn manifests_without_volume_lines_mean_a_volume_where_everything_held() {
        let m = Manifest::parse("packsync-manifest 1\nfuture-key 7\n---\nd 0755 0 0 0 1.0 - - .\n")
            .unwrap();
        assert!(m.link_meta && m.hardlinks);
        assert_eq!(m.granularity_ns, 1);
        assert!(Manifest::parse("packsync-manifest 1\nlinkmeta yes\n---\n").is_err());
    }

    #[test]
    fn rejects_other_versions_and_garbage() {
        assert!(Manifest::parse("packsync-manifest 2\n---\n").is_err());
        assert!(Manifest::parse("hello\n").is_err());
        assert!(Manifest::parse("packsync-manifest 1\n---\nf 0644 0 0 1 0.0 - - a/b\n").is_err());
    }
}
