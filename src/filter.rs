//! `--exclude`, `--include`, `--exclude-from` and `--xattrs`: which paths a
//! scan leaves out, and what it reads of each entry besides its stat. Built
//! once from the command line (`cli`, into `Config`), read by every source
//! kind and the scan; a leaf, so all of them can import it.

use anyhow::{Context, Result};

use crate::sys;

/// Which paths a scan leaves out (gitignore rules, in command-line order),
/// and what it reads of each entry besides its stat.
#[derive(Clone, Default)]
pub struct Filter {
    rules: Option<ignore::gitignore::Gitignore>,
    /// `--xattrs`: a directory source's files and directories carry their
    /// extended attributes (one more call an entry, so only when asked).
    pub xattrs: bool,
}

impl Filter {
    /// `rules`: gitignore lines; `!pattern` re-includes.
    pub fn new(rules: &[String]) -> Result<Filter> {
        if rules.is_empty() {
            return Ok(Filter::default());
        }
        let mut b = ignore::gitignore::GitignoreBuilder::new("/");
        for r in rules {
            b.add_line(None, r)
                .with_context(|| format!("bad pattern {r:?}"))?;
        }
        Ok(Filter {
            rules: Some(b.build().context("bad exclude/include patterns")?),
            xattrs: false,
        })
    }

    pub fn excludes(&self, rel: &[u8], is_dir: bool) -> bool {
        match &self.rules {
            None => false,
            Some(g) => g
                .matched(std::path::Path::new(sys::os(rel)), is_dir)
                .is_ignore(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_none()
    }
}
