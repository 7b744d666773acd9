//! Where a dataset or model name points on disk: a path, or a hub id in the Hugging Face hub cache
//! (`<cache>/datasets--<org>--<name>/snapshots/<commit>/`, `models--...` for models, the commit read
//! from `refs/<revision>`, as `huggingface_hub` lays it out). Looked up, never downloaded.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The hub cache directory as `huggingface_hub` finds it: `HF_HUB_CACHE` (or its older name
/// `HUGGINGFACE_HUB_CACHE`), else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// `name` on disk: an existing file or directory as it is; else a hub id (`org/name`, optionally
/// `@revision`, default `main`) resolved to its snapshot in the local hub cache.
pub fn locate(name: &str) -> Result<PathBuf> {
    locate_in(name, hub_cache_dir().as_deref())
}

/// [`locate`] with the hub cache given (none: only paths resolve).
pub fn locate_in(name: &str, cache: Option<&Path>) -> Result<PathBuf> {
    let path = Path::new(name);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let (id, revision) = name.split_once('@').unwrap_or((name, "main"));
    let leaf = id.rsplit('/').next().unwrap_or(id).to_owned();
    let not_found = |looked: String| Error::NotFound { name: id.to_owned(), looked, leaf: leaf.clone() };
    let Some(cache) = cache else {
        return Err(not_found(String::from("no cache directory: HOME and HF_HOME are unset")));
    };
    let repo = repo_dir(cache, "datasets", id);
    if !repo.is_dir() {
        return Err(not_found(format!("looked for {}", repo.display())));
    }
    snapshot(&repo, revision)
}

/// Whether `name` could be a hub id (`org/name` or `name`, optionally `@revision`): not a path
/// that starts at the root, the home or the current directory, and at most one `/`.
pub fn looks_like_hub_id(name: &str) -> bool {
    let bare = name.split_once('@').map_or(name, |(id, _)| id);
    !bare.is_empty() && !bare.starts_with(['/', '.', '~']) && bare.matches('/').count() <= 1
}

/// The snapshot of a model hub id (`org/name`, optionally `@revision`) in the local hub cache, as
/// transformers finds it offline; `None` when `id` is an existing path or the cache has no such
/// model (the caller's own "not a model directory" error then stands).
pub fn cached_model(id: &str) -> Result<Option<PathBuf>> {
    cached_model_in(id, hub_cache_dir().as_deref())
}

/// [`cached_model`] with the hub cache given.
pub fn cached_model_in(id: &str, cache: Option<&Path>) -> Result<Option<PathBuf>> {
    let (bare, revision) = id.split_once('@').unwrap_or((id, "main"));
    let Some(cache) = cache.filter(|_| looks_like_hub_id(id) && !Path::new(id).exists()) else {
        return Ok(None);
    };
    let repo = repo_dir(cache, "models", bare);
    if !repo.is_dir() {
        return Ok(None);
    }
    snapshot(&repo, revision).map(Some)
}

/// `<cache>/<kind>--<org>--<name>`.
fn repo_dir(cache: &Path, kind: &str, id: &str) -> PathBuf {
    cache.join(format!("{kind}--{}", id.replace('/', "--")))
}

/// The snapshot directory of `revision` (a branch or tag with a `refs/` file, or a commit).
fn snapshot(repo: &Path, revision: &str) -> Result<PathBuf> {
    let snapshots = repo.join("snapshots");
    let fail = |message: String| Error::Snapshot { repo: repo.to_path_buf(), message };
    let reference = repo.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&reference) {
        Ok(text) => text.trim().to_owned(),
        Err(_) if snapshots.join(revision).is_dir() => revision.to_owned(),
        Err(_) => {
            let have = list(&snapshots);
            return match (revision, have.as_slice()) {
                ("main", [only]) => Ok(snapshots.join(only)),
                _ => Err(fail(format!(
                    "no `refs/{revision}` and no snapshot of that name; snapshots: {}",
                    if have.is_empty() { String::from("none") } else { have.join(", ") }
                ))),
            };
        }
    };
    let dir = snapshots.join(&commit);
    if !dir.is_dir() {
        return Err(fail(format!("`refs/{revision}` names commit {commit}, whose snapshot is not there")));
    }
    Ok(dir)
}

/// Names in a directory, sorted (none when it cannot be read).
fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache holding `org/data` at commit `abc` (main) and `def` (a tag `v1`).
    fn cache() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("datasets--org--data");
        for commit in ["abc", "def"] {
            std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        }
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc\n").unwrap();
        std::fs::write(repo.join("refs/v1"), "def").unwrap();
        dir
    }

    #[test]
    fn hub_ids_are_told_from_paths() {
        for id in ["Qwen/Qwen3-0.6B", "gpt2", "org/data@v1"] {
            assert!(looks_like_hub_id(id), "{id}");
        }
        for path in ["/nonexistent", "./models/tiny", "../x", "~/m", "outputs/models/tiny", "", "@v1"] {
            assert!(!looks_like_hub_id(path), "{path}");
        }
    }

    #[test]
    fn a_hub_id_resolves_to_the_snapshot_of_its_revision() {
        let c = cache();
        let at = |name: &str| locate_in(name, Some(c.path())).unwrap();
        assert!(at("org/data").ends_with("snapshots/abc"));
        assert!(at("org/data@v1").ends_with("snapshots/def"));
        assert!(at("org/data@def").ends_with("snapshots/def"));
        let err = locate_in("org/data@v2", Some(c.path())).unwrap_err().to_string();
        assert!(err.contains("no `refs/v2`") && err.contains("abc, def"), "{err}");
    }

    #[test]
    fn a_lone_snapshot_is_main_without_refs() {
        let c = cache();
        let repo = c.path().join("datasets--org--data");
        std::fs::remove_dir_all(repo.join("refs")).unwrap();
        assert!(locate_in("org/data", Some(c.path())).is_err(), "two snapshots: which is main is unknown");
        std::fs::remove_dir_all(repo.join("snapshots/def")).unwrap();
        assert!(locate_in("org/data", Some(c.path())).unwrap().ends_with("snapshots/abc"));
    }

    #[test]
    fn a_missing_dataset_says_where_it_looked_and_how_to_fetch_it() {
        let c = cache();
        let err = locate_in("org/other", Some(c.path())).unwrap_err().to_string();
        assert!(err.contains("datasets--org--other"), "{err}");
        assert!(err.contains("hf download org/other --repo-type dataset"), "{err}");
        assert!(err.contains("--local-dir data/other"), "{err}");
        let err = locate_in("org/other", None).unwrap_err().to_string();
        assert!(err.contains("no cache directory"), "{err}");
    }

    #[test]
    fn a_model_id_resolves_in_the_cache_and_anything_else_is_none() {
        let c = cache();
        let repo = c.path().join("models--Qwen--Qwen3-0.6B");
        std::fs::create_dir_all(repo.join("snapshots/c1")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "c1").unwrap();
        let found = cached_model_in("Qwen/Qwen3-0.6B", Some(c.path())).unwrap().unwrap();
        assert!(found.ends_with("models--Qwen--Qwen3-0.6B/snapshots/c1"));
        for other in ["Qwen/Qwen3-8B", "./Qwen/Qwen3-0.6B", "/abs/dir", "a/b/c", ""] {
            assert_eq!(cached_model_in(other, Some(c.path())).unwrap(), None, "{other}");
        }
        assert_eq!(cached_model_in("Qwen/Qwen3-0.6B", None).unwrap(), None);
        let err = cached_model_in("Qwen/Qwen3-0.6B@v9", Some(c.path())).unwrap_err().to_string();
        assert!(err.contains("no `refs/v9`"), "{err}");
    }

    #[test]
    fn an_existing_path_is_taken_as_it_is() {
        let c = cache();
        let file = c.path().join("rows.jsonl");
        std::fs::write(&file, "{}\n").unwrap();
        assert_eq!(locate_in(file.to_str().unwrap(), None).unwrap(), file);
        let refs_broken = c.path().join("datasets--org--data/refs/main");
        std::fs::write(refs_broken, "zzz").unwrap();
        let err = locate_in("org/data", Some(c.path())).unwrap_err().to_string();
        assert!(err.contains("commit zzz"), "{err}");
    }
}
