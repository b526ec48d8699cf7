//! The live generation, opened once per round: its name, its root in
//! `gen/`, and its manifest, whose header is read once and whose entries
//! any stage of the round reads again from the one descriptor (whole, from
//! after the header, or indexed by directory), never by opening the file
//! again. A generation's manifest never changes once published (it is
//! named by its digest), so one read stands for every later one; and a
//! descriptor held across the round reads the same bytes even if another
//! writer retires the generation meanwhile.
//!
//! Each reader has a position of its own (`pread`), so readers taken one
//! after another, or at once on two threads, never move each other.

use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};

use anyhow::Result;

use crate::index::Index;
use crate::layout;
use crate::manifest::Manifest;
use crate::sys::{self, DirFd};
use crate::volume::{State, Volume};

/// What one round reads of the live generation.
pub struct LiveGen {
    pub gen: String,
    /// `STATE/gen/GEN`, as messages name its entries.
    pub label: String,
    /// Its directory in `gen/`, or why it cannot be opened (removed since
    /// DEST was read, or not a directory).
    root: Result<DirFd>,
    /// Its manifest, opened; `None` where it is missing.
    manifest: Option<Opened>,
}

struct Opened {
    fd: OwnedFd,
    /// `STATE/meta/GEN.manifest`, as messages name it.
    shown: String,
    /// The header; `None` where it does not parse.
    header: Option<Manifest>,
    /// Where the entries begin, after the header's `---`.
    body: u64,
}

/// A manifest read through one descriptor at a position of its own.
pub type Reader = BufReader<At>;

const BUF: usize = 256 * 1024;

impl LiveGen {
    /// Open generation `gen` of `state`: its root, its manifest and the
    /// manifest's header, once. Nothing fails here: what cannot be read is
    /// `None` (or the root's error) for each use to decide on.
    pub fn open(vol: &Volume, state: &State, gen: &str) -> LiveGen {
        let root = layout::open_generation(vol, state, gen);
        let manifest = state.manifest_reader(gen).ok().and_then(|(r, shown)| {
            let fd = OwnedFd::from(r.into_inner());
            let mut r = reader(&fd, 0)?;
            let header = Manifest::read_header(&mut r).ok();
            let body = r.stream_position().ok()?;
            Some(Opened {
                fd,
                shown,
                header,
                body,
            })
        });
        LiveGen {
            gen: gen.to_string(),
            label: format!("{}/gen/{gen}", state.path.display()),
            root,
            manifest,
        }
    }

    /// The manifest's header, where the manifest is there and parses.
    pub fn header(&self) -> Option<&Manifest> {
        self.manifest.as_ref()?.header.as_ref()
    }

    /// The generation's root, or why it cannot be opened.
    pub fn root(&self) -> Result<&DirFd, &anyhow::Error> {
        self.root.as_ref()
    }

    /// A handle of its own on the root (for a stage that keeps it).
    pub fn root_owned(&self) -> Option<DirFd> {
        self.root.as_ref().ok()?.try_clone().ok()
    }

    /// The whole manifest, header first, for `Manifest::read`.
    pub fn reader(&self) -> Option<Reader> {
        reader(&self.manifest.as_ref()?.fd, 0)
    }

    /// The manifest's entries, after its header (which parsed).
    pub fn body(&self) -> Option<Reader> {
        let m = self.manifest.as_ref().filter(|m| m.header.is_some())?;
        reader(&m.fd, m.body)
    }

    /// The manifest's entries indexed by directory (`Index::build`);
    /// `None` where it does not index.
    pub fn index(&self) -> Option<Index> {
        let m = self.manifest.as_ref()?;
        let r = self.body()?;
        let file = Box::new(m.fd.try_clone().ok()?);
        Index::build(r, file, m.shown.clone()).ok()
    }

    /// `index`, where the manifest's lines also give the digest its header
    /// records (checked line by line as they are indexed, never held).
    pub fn checked_index(&self) -> Option<Index> {
        let m = self.manifest.as_ref()?;
        let header = m.header.as_ref()?;
        let r = self.body()?;
        let file = Box::new(m.fd.try_clone().ok()?);
        let mut digest = crate::manifest::LineDigest::default();
        let mut each = |path: &[u8], e: &crate::tree::Entry| {
            digest.entry(path, e);
        };
        let ix = Index::build_each(r, file, m.shown.clone(), &mut each).ok()?;
        digest.matches(header).then_some(ix)
    }

    /// The whole manifest read (not checked against its digest).
    pub fn read(&self) -> Option<Manifest> {
        Manifest::read(&mut self.reader()?).ok()
    }
}

/// A reader of `fd` from `pos`, through a duplicate of it (`None` where
/// descriptors ran out).
fn reader(fd: &OwnedFd, pos: u64) -> Option<Reader> {
    let fd = fd.try_clone().ok()?;
    Some(BufReader::with_capacity(BUF, At { fd, pos }))
}

/// A descriptor read at a position of its own (`pread`): a duplicate of
/// the manifest's, so any number can be read at once.
pub struct At {
    fd: OwnedFd,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = sys::pread(self.fd.as_fd(), buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(_) => return Err(io::ErrorKind::Unsupported.into()),
        };
        self.pos = pos.ok_or(io::ErrorKind::InvalidInput)?;
        Ok(self.pos)
    }
}
