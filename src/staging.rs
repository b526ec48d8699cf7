//! `Stage`: one writer's staging directory, `stage/<host>-<pid>-<random>`,
//! as a guard value. Made by `Stage::new`; removed, with everything in it,
//! when it is dropped: after a commit, after any error (a `?` anywhere in
//! the pipeline), and after SIGINT/SIGTERM, which long work turns into an
//! `Interrupted` error that unwinds through here. Only SIGKILL (or a power
//! cut) leaves one behind; `retire` removes those of writers that are gone.
//!
//! It knows nothing of what is staged inside it: `stage` fills `tree/`,
//! `commit` moves it into `gen/`. It never touches anything outside its own
//! directory, but for removing that directory from `stage/`.

use anyhow::{Context, Result};

use crate::sys::DirFd;
use crate::volume::{unique_name, State};

/// How often a running copy refreshes its staging directory's mtime; far
/// below `config::STALE_STAGE`, after which other hosts may remove it.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(60);

/// One writer's staging directory; removed when dropped (or by `remove`).
pub struct Stage {
    /// `<host>-<pid>-<random>`: unique, and says who made it (`volume::stage_owner`).
    pub name: String,
    dir: DirFd,
    /// `stage/`, to remove `name` from.
    parent: DirFd,
    removed: bool,
}

impl Stage {
    /// Make this process's staging directory in `state`'s `stage/`.
    pub fn new(state: &State) -> Result<Stage> {
        let name = unique_name();
        let shown = || format!("{}/stage/{name}", state.path.display());
        let parent = state
            .stage
            .try_clone()
            .with_context(|| format!("cannot open {}/stage", state.path.display()))?;
        parent
            .mkdir(name.as_bytes(), 0o700)
            .with_context(|| format!("cannot create {}", shown()))?;
        let dir = match parent.open_dir(name.as_bytes()) {
            Ok(dir) => dir,
            Err(e) => {
                let _ = parent.remove_tree(name.as_bytes());
                return Err(e).with_context(|| format!("cannot open {}", shown()));
            }
        };
        Ok(Stage {
            name,
            dir,
            parent,
            removed: false,
        })
    }

    /// The staging directory's handle (`stage::run` makes `tree/` in it).
    pub fn dir(&self) -> &DirFd {
        &self.dir
    }

    /// Remove the staging directory and everything in it now (dropping it
    /// does the same, once).
    pub fn remove(&mut self) {
        if !std::mem::replace(&mut self.removed, true) {
            let _ = self.parent.remove_tree(self.name.as_bytes());
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::Volume;

    fn state(t: &tempfile::TempDir) -> State {
        let vol = Volume::open(&t.path().join("packs"), false).unwrap();
        vol.state(true).unwrap().expect("created")
    }

    fn staged(t: &tempfile::TempDir) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(t.path().join(".packs.packsync/stage"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn dropping_a_stage_removes_it_with_its_contents() {
        let t = tempfile::tempdir().unwrap();
        let state = state(&t);
        let stage = Stage::new(&state).unwrap();
        assert_eq!(staged(&t), vec![stage.name.clone()]);
        stage.dir().mkdir(b"tree", 0o700).unwrap();
        let tree = stage.dir().open_dir(b"tree").unwrap();
        tree.mkdir(b"d", 0o755).unwrap();
        tree.open_dir(b"d").unwrap().make_file(b"f").unwrap();
        drop(tree);
        drop(stage);
        assert!(staged(&t).is_empty());
    }

    #[test]
    fn an_error_that_unwinds_through_a_stage_removes_it() {
        let t = tempfile::tempdir().unwrap();
        let state = state(&t);
        let fails = || -> Result<()> {
            let stage = Stage::new(&state)?;
            stage.dir().mkdir(b"tree", 0o700)?;
            stage.dir().mkdir(b"tree", 0o700)?; // `tree` exists: an error
            Ok(())
        };
        assert!(fails().is_err());
        assert!(staged(&t).is_empty());
    }

    #[test]
    fn removing_early_then_dropping_removes_once() {
        let t = tempfile::tempdir().unwrap();
        let state = state(&t);
        let mut first = Stage::new(&state).unwrap();
        let second = Stage::new(&state).unwrap();
        assert_ne!(first.name, second.name);
        first.remove();
        assert_eq!(staged(&t), vec![second.name.clone()]);
        drop(first);
        assert_eq!(staged(&t), vec![second.name.clone()]);
        drop(second);
        assert!(staged(&t).is_empty());
    }
}
