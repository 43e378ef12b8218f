//! `--model ORG/NAME`: a checkpoint in the local Hugging Face cache, never the network.
//!
//! The hub lays a repo out as `<cache>/models--ORG--NAME/refs/<revision>` (a file holding a
//! commit hash) and `snapshots/<hash>/` (the files, symlinks into `blobs/`). Pure over the cache
//! folder it is given, so tests build one in a temp dir; [`cache_dir`] reads the environment.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The hub cache folder as huggingface_hub picks it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
/// else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. `var` reads one
/// environment variable (empty counts as unset).
pub fn cache_dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = set("HF_HUB_CACHE") {
        return Some(p);
    }
    if let Some(p) = set("HF_HOME") {
        return Some(p.join("hub"));
    }
    if let Some(p) = set("XDG_CACHE_HOME") {
        return Some(p.join("huggingface/hub"));
    }
    set("HOME").map(|h| h.join(".cache/huggingface/hub"))
}

/// Whether `--model` text reads as a hub id `ORG/NAME` rather than a path.
pub fn looks_like_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    ok(org) && ok(name)
}

/// The snapshot folder of `id` at `revision` (a branch or tag under `refs/`, or a commit hash
/// with a snapshot) in the cache `root`.
pub fn resolve(root: &Path, id: &str, revision: &str) -> Result<PathBuf> {
    if !looks_like_id(id) {
        bail!("--model {id}: not a folder, nor a Hugging Face id ORG/NAME");
    }
    let repo = root.join(format!("models--{}", id.replace('/', "--")));
    if !repo.is_dir() {
        bail!(
            "--model {id}: no such folder, and not in the Hugging Face cache (searched {}; \
             set HF_HUB_CACHE or HF_HOME, or download it with `hf download {id}`)",
            repo.display()
        );
    }
    // Joined to paths below: a revision (a branch, a tag, `refs/pr/1`, a commit) never climbs
    // out of the repository's folder.
    if revision.is_empty()
        || Path::new(revision).components().any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        bail!("--revision {revision:?}: not a branch, tag or commit");
    }
    let by_hash = repo.join("snapshots").join(revision);
    // A commit, whole or as a snapshot folder's name (a short hash the cache holds)
    if (is_commit_hash(revision) || !revision.contains('/')) && by_hash.is_dir() {
        return Ok(by_hash);
    }
    let reference = repo.join("refs").join(revision);
    let hash = match std::fs::read_to_string(&reference) {
        Ok(h) => h.trim().to_string(),
        Err(_) => bail!(
            "--model {id}: revision {revision:?} is not in the cache (searched {} and {})",
            reference.display(),
            by_hash.display()
        ),
    };
    // (what a ref holds is input too: one folder name, never a path)
    if hash.is_empty() || hash.contains(['/', '\\']) || hash == "." || hash == ".." {
        bail!("--model {id}: {} holds {hash:?}, not a commit", reference.display());
    }
    let snapshot = repo.join("snapshots").join(&hash);
    if !snapshot.is_dir() {
        bail!(
            "--model {id}: {} names snapshot {hash}, but {} is missing",
            reference.display(),
            snapshot.display()
        );
    }
    Ok(snapshot)
}

/// A checkpoint snapshot in the cache, as `unmask models` lists it.
#[derive(Debug, PartialEq)]
pub struct Cached {
    /// `ORG/NAME`.
    pub id: String,
    /// The refs naming this snapshot (`main`, a tag), else its commit, cut to 12 characters.
    pub revision: String,
    pub snapshot: PathBuf,
    /// Loadable (its family and size), or why not.
    pub verdict: Result<Loadable, String>,
}

#[derive(Debug, PartialEq)]
pub struct Loadable {
    pub model_type: String,
    pub params: usize,
    /// The weight files' bytes.
    pub bytes: u64,
}

/// Every snapshot of every model repository in the cache `root`, ordered by id then revision
/// (the snapshot `main` names first). Folders that are not the hub's (`datasets--`, locks)
/// are skipped; a repository that cannot be read is a row saying why.
pub fn cached(root: &Path) -> Result<Vec<Cached>> {
    let entries = std::fs::read_dir(root)
        .map_err(|e| anyhow::anyhow!("{}: {}", root.display(), crate::limits::io_reason(&e)))?;
    let mut repos: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_prefix("models--")?.replacen("--", "/", 1);
            looks_like_id(&id).then(|| (id, e.path()))
        })
        .collect();
    repos.sort();
    Ok(repos.into_iter().flat_map(|(id, repo)| snapshots(&id, &repo)).collect())
}

/// The snapshots of one repository folder, each with the refs that name it.
fn snapshots(id: &str, repo: &Path) -> Vec<Cached> {
    let refs = refs(repo);
    let Ok(dirs) = std::fs::read_dir(repo.join("snapshots")) else {
        return vec![Cached {
            id: id.to_string(),
            revision: "-".into(),
            snapshot: repo.join("snapshots"),
            verdict: Err("no snapshots folder (a download that never finished?)".into()),
        }];
    };
    let mut out: Vec<Cached> = dirs
        .flatten()
        .filter(|d| d.path().is_dir())
        .map(|d| {
            let hash = d.file_name().to_string_lossy().into_owned();
            let named: Vec<&str> =
                refs.iter().filter(|(_, h)| *h == hash).map(|(r, _)| r.as_str()).collect();
            let revision =
                if named.is_empty() { hash.chars().take(12).collect() } else { named.join(", ") };
            Cached { id: id.to_string(), revision, verdict: inspect(&d.path()), snapshot: d.path() }
        })
        .collect();
    // `main` first, then by revision
    out.sort_by_key(|c| (!c.revision.split(", ").any(|r| r == "main"), c.revision.clone()));
    out
}

/// `refs/**` of a repository: (ref name, commit), `main` and `refs/pr/1` alike.
fn refs(repo: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.path().is_dir() {
                walk(&e.path(), &format!("{name}/"), out);
            } else if let Ok(h) = std::fs::read_to_string(e.path()) {
                out.push((name, h.trim().to_string()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo.join("refs"), "", &mut out);
    out.sort();
    out
}

/// Whether unmask can load the snapshot `dir`: its config (every check `--model` makes of
/// it), a tokenizer and weight files that exist; no weights are read.
fn inspect(dir: &Path) -> Result<Loadable, String> {
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config)
        .map_err(|e| format!("config.json: {}", crate::limits::io_reason(&e)))?;
    unknown_family(&text)?;
    let (cfg, _) =
        super::registry::check_config(&text, "config.json").map_err(|e| format!("{e:#}"))?;
    // (a gzip'ed tokenizer.json is read too: the test fixtures ship one)
    if !dir.join("tokenizer.json").is_file() && !dir.join("tokenizer.json.gz").is_file() {
        return Err("no tokenizer.json".into());
    }
    let files = super::weight_files(dir).map_err(|e| format!("{e:#}"))?;
    let mut bytes = 0;
    for f in &files {
        let meta = std::fs::metadata(f).map_err(|e| {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            format!("{name}: {} (a download that never finished?)", crate::limits::io_reason(&e))
        })?;
        bytes += meta.len();
    }
    Ok(Loadable { model_type: cfg.model_type.clone(), params: cfg.num_params(), bytes })
}

/// A config of a family unmask does not know, said as such: the shared checks would first
/// name a field it lacks (`vocab_size` of a vision model), which says less.
fn unknown_family(text: &str) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(default)]
        model_type: String,
        #[serde(default)]
        architectures: Vec<String>,
    }
    let Ok(kind) = serde_json::from_str::<Kind>(text) else { return Ok(()) };
    let families = super::registry::FAMILIES;
    let known = families.iter().any(|f| {
        f.model_types.contains(&kind.model_type.as_str())
            || kind.architectures.iter().any(|a| f.architectures.contains(&a.as_str()))
    });
    if known {
        return Ok(());
    }
    let names: Vec<&str> = families.iter().flat_map(|f| f.model_types.iter().copied()).collect();
    Err(format!(
        "model_type {:?} is not a family unmask decodes ({})",
        kind.model_type,
        names.join(", ")
    ))
}

fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A cache as the hub writes it: blobs, a snapshot of symlinks to them, refs/main.
    fn cache() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--JetAstra--SDAR-4B-Chat");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        let snap = repo.join("snapshots").join(HASH);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(repo.join("blobs/aa11"), "{\"model_type\":\"sdar\"}").unwrap();
        std::os::unix::fs::symlink("../../blobs/aa11", snap.join("config.json")).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{HASH}\n")).unwrap();
        dir
    }

    #[test]
    fn resolves_refs_main_to_the_snapshot_and_reads_through_symlinks() {
        let c = cache();
        let snap = resolve(c.path(), "JetAstra/SDAR-4B-Chat", "main").unwrap();
        assert_eq!(snap, c.path().join("models--JetAstra--SDAR-4B-Chat/snapshots").join(HASH));
        assert_eq!(
            std::fs::read_to_string(snap.join("config.json")).unwrap(),
            "{\"model_type\":\"sdar\"}"
        );
        assert_eq!(resolve(c.path(), "JetAstra/SDAR-4B-Chat", HASH).unwrap(), snap);
    }

    #[test]
    fn misses_name_the_folders_searched() {
        let c = cache();
        let root = c.path().display();
        let e = format!("{:#}", resolve(c.path(), "JetAstra/SDAR-8B-Chat", "main").unwrap_err());
        assert_eq!(
            e,
            format!(
                "--model JetAstra/SDAR-8B-Chat: no such folder, and not in the Hugging Face cache \
                 (searched {root}/models--JetAstra--SDAR-8B-Chat; set HF_HUB_CACHE or HF_HOME, \
                 or download it with `hf download JetAstra/SDAR-8B-Chat`)"
            )
        );
        let e = format!("{:#}", resolve(c.path(), "JetAstra/SDAR-4B-Chat", "v2").unwrap_err());
        let repo = format!("{root}/models--JetAstra--SDAR-4B-Chat");
        assert_eq!(
            e,
            format!("--model JetAstra/SDAR-4B-Chat: revision \"v2\" is not in the cache (searched {repo}/refs/v2 and {repo}/snapshots/v2)")
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_ref_to_a_missing_snapshot_is_named() {
        let c = cache();
        let repo = c.path().join("models--JetAstra--SDAR-4B-Chat");
        std::fs::write(repo.join("refs/dev"), "ffff").unwrap();
        let e = format!("{:#}", resolve(c.path(), "JetAstra/SDAR-4B-Chat", "dev").unwrap_err());
        assert!(
            e.ends_with(&format!(
                "names snapshot ffff, but {}/snapshots/ffff is missing",
                repo.display()
            )),
            "{e}"
        );
    }

    /// A revision and what a ref holds are joined to paths: neither may climb out of the
    /// repository; an empty ref is named as such; a short hash the cache holds resolves.
    #[test]
    fn revisions_and_refs_stay_inside_the_repository() {
        let c = cache();
        let repo = c.path().join("models--JetAstra--SDAR-4B-Chat");
        for bad in ["../../x", "/etc", ".."] {
            let e = format!("{:#}", resolve(c.path(), "JetAstra/SDAR-4B-Chat", bad).unwrap_err());
            assert_eq!(e, format!("--revision {bad:?}: not a branch, tag or commit"));
        }
        for (content, shown) in [("../../../../etc", "\"../../../../etc\""), ("\n", "\"\"")] {
            std::fs::write(repo.join("refs/evil"), content).unwrap();
            let e =
                format!("{:#}", resolve(c.path(), "JetAstra/SDAR-4B-Chat", "evil").unwrap_err());
            assert!(e.ends_with(&format!("refs/evil holds {shown}, not a commit")), "{e}");
        }
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        assert_eq!(
            resolve(c.path(), "JetAstra/SDAR-4B-Chat", "abc123").unwrap(),
            repo.join("snapshots/abc123")
        );
    }

    #[test]
    fn ids_and_paths_are_told_apart() {
        assert!(looks_like_id("JetAstra/SDAR-1.7B-Chat"));
        for s in ["/abs/path", "./rel/x", "a/b/c", "models", "~/models", "a/", "../x"] {
            assert!(!looks_like_id(s), "{s}");
        }
    }

    #[test]
    fn cache_dir_follows_huggingface_hub_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        static ALL: [(&str, &str); 4] = [
            ("HF_HUB_CACHE", "/c"),
            ("HF_HOME", "/h"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/home/u"),
        ];
        let all = &ALL;
        assert_eq!(cache_dir(env(all)), Some(PathBuf::from("/c")));
        assert_eq!(cache_dir(env(&all[1..])), Some(PathBuf::from("/h/hub")));
        assert_eq!(cache_dir(env(&all[2..])), Some(PathBuf::from("/x/huggingface/hub")));
        assert_eq!(
            cache_dir(env(&all[3..])),
            Some(PathBuf::from("/home/u/.cache/huggingface/hub"))
        );
        assert_eq!(
            cache_dir(env(&[("HF_HUB_CACHE", ""), ("HOME", "/r")])),
            Some(PathBuf::from("/r/.cache/huggingface/hub"))
        );
    }
}
