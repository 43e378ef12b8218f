//! Files the commands write: never one of their inputs, and never half-written.
//!
//! - [`refuse_clashes`]: an output that is an input (the same file by device and inode, so
//!   through symlinks and hard links too) or another output is refused with a one-line error
//!   before anything is opened for writing. The inputs of a decode are its `--prompt-file`
//!   and every file of the checkpoint folder it loads ([`crate::cli::session::decode_inputs`]).
//! - [`check_writable`]: a finished output is checked before the work that fills it (a
//!   folder, a missing or read-only folder fail at once, not after a long decode).
//! - `-` as an output is stdout ([`is_stdout`]), as it is stdin for the inputs; except the
//!   `--json` of a command whose stdout holds its results ([`check_report_path`]).
//! - [`write_atomically`]: a finished output (a cast, an export, a `--json` report) is written to a temporary
//!   file in the same folder and renamed over the target, so a failure or an interruption
//!   leaves either the old file or the whole new one. Streamed outputs (`trace --out`,
//!   `record --trace`) are written in place, one flushed line per event, so that an
//!   interrupted run keeps every event up to the interruption.
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

/// What a path names: an existing file (by device and inode: every link to it is the same),
/// or, for a path that does not exist yet, its absolute form with the folder resolved.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    File { dev: u64, ino: u64 },
    New(PathBuf),
}

fn identity(path: &Path) -> Identity {
    if let Ok(m) = std::fs::metadata(path) {
        return Identity::File { dev: m.dev(), ino: m.ino() };
    }
    // A dangling symlink names the file it would create.
    let path = std::fs::read_link(path)
        .map(|t| path.parent().unwrap_or(Path::new("")).join(t))
        .unwrap_or_else(|_| path.to_path_buf());
    let dir = folder_of(&path);
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Identity::New(dir.join(path.file_name().unwrap_or_default()))
}

/// Whether an output path is `-`, which means stdout (as `-` means stdin for an input).
pub fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

/// Fails if any output is one of `inputs` or the same file as another output.
/// `outputs` and `inputs` are `(flag or role, path)` pairs, named in the error. An output `-`
/// is stdout and an input `-` stdin: neither is a file, but two outputs cannot both be stdout.
fn refuse_clashes(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (i, (role, out)) in outputs.iter().enumerate() {
        if is_stdout(out) {
            if let Some((other_role, _)) = outputs[..i].iter().find(|(_, o)| is_stdout(o)) {
                bail!("{role} - and {other_role} - would both write to stdout; give one of them a file");
            }
            continue;
        }
        let id = identity(out);
        for (in_role, input) in inputs {
            if !is_stdout(input) && identity(input) == id {
                bail!(
                    "{}: {role} would overwrite the {in_role} ({}); choose another path",
                    out.display(),
                    input.display()
                );
            }
        }
        // (/dev/null, or a terminal, may take two outputs)
        let device = std::fs::metadata(out)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()));
        for (other_role, other) in &outputs[..i] {
            if !device && !is_stdout(other) && identity(other) == id {
                bail!(
                    "{}: {role} and {other_role} are the same file; choose two paths",
                    out.display()
                );
            }
        }
    }
    Ok(())
}

/// Vets a command's outputs before its work: none is one of `inputs` or another output
/// ([`refuse_clashes`]), and each can be written ([`check_writable`]), in that order.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    refuse_clashes(outputs, inputs)?;
    outputs.iter().try_for_each(|(flag, p)| check_writable(flag, p))
}

/// Checks, before the work that fills it, that [`write_atomically`] can write `path` (`flag`
/// names it in the error): not a folder; if a file, one the user may write; its folder exists
/// and takes a new file (a temporary file is created there and deleted). A device or a FIFO
/// is written in place and not opened here (a FIFO would wait for its reader); `-` is stdout.
fn check_writable(flag: &str, path: &Path) -> Result<()> {
    if is_stdout(path) {
        return Ok(());
    }
    let name = path.display();
    if let Some(why) = refused_link(path) {
        bail!("{flag} {name}: {why}");
    }
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match std::fs::metadata(&target) {
        Ok(m) if m.is_dir() => bail!("{flag} {name}: is a folder; name a file"),
        Ok(m) if m.is_file() => {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .with_context(|| format!("{flag} {name}: cannot write"))?;
        }
        Ok(_) => return Ok(()),
        Err(_) => {}
    }
    let dir = folder_of(&target);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{flag} {name}: {} is not a folder", dir.display()),
        Err(e) => return Err(folder_error(&format!("{flag} {name}"), dir, &e)),
    }
    tempfile::Builder::new()
        .prefix(".unmask-check.")
        .tempfile_in(dir)
        .map_err(|e| folder_error(&format!("{flag} {name}"), dir, &e))?;
    Ok(())
}

/// Why an output `path` that is a symbolic link is refused, if it is one: a link to a file, a
/// folder, or nothing yet. Writing through it, as the shell's `>` does, would truncate or
/// replace whatever it points at (a link left in a shared folder, or in a checkpoint, can point
/// anywhere); replacing it would silently drop a link the user made. Written through, as
/// devices are, are a link to a device or a FIFO (`/dev/null` by another name) and the
/// process's own descriptors (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`, which name what
/// the shell opened, whatever it is).
fn refused_link(path: &Path) -> Option<String> {
    let link = std::fs::symlink_metadata(path).ok()?;
    if !link.file_type().is_symlink() || written_in_place(path) {
        return None;
    }
    let to = std::fs::read_link(path).map(|t| t.display().to_string()).unwrap_or_default();
    Some(format!(
        "is a symbolic link (to {}); outputs are not written through links: name the file itself, or remove the link",
        crate::glyph::escape_line(&to)
    ))
}

/// Whether `path` is written in place rather than replaced: it is not a file or a folder (a
/// device, a FIFO, a socket, through a link or not) or it is one of the process's descriptors.
fn written_in_place(path: &Path) -> bool {
    let descriptor = |p: &Path| p.starts_with("/proc/self/fd") || p.starts_with("/dev/fd");
    if descriptor(path) || std::fs::read_link(path).is_ok_and(|t| descriptor(&t)) {
        return true;
    }
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// The folder a file `path` goes in: its parent, `.` for a bare name.
fn folder_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Why a file cannot be created in `dir`, the folder of output `name`, in the user's terms:
/// the temporary file's random name (`.x.csv.L8Kw36.unmask-tmp`) that tempfile puts in its
/// errors is never shown.
fn folder_error(name: &str, dir: &Path, e: &std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind;
    let d = dir.display();
    match e.kind() {
        ErrorKind::NotFound => anyhow::anyhow!("{name}: the folder {d} does not exist"),
        ErrorKind::NotADirectory => anyhow::anyhow!("{name}: {d} is not a folder"),
        _ => anyhow::anyhow!("{name}: cannot create a file in {d}: {}", without_temp_path(e)),
    }
}

/// An error of tempfile's without the ` at path "..."` it appends (the temporary file's name).
fn without_temp_path(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" at path \"") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Temporary files not yet renamed into place: a signal that cuts the run short deletes them.
static UNFINISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Deletes the temporary files of outputs still being written (called on the way out).
pub fn remove_unfinished() {
    for p in UNFINISHED.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

fn forget(p: &Path) {
    UNFINISHED.lock().unwrap_or_else(|e| e.into_inner()).retain(|q| q != p);
}

/// Writes `path` whole or not at all: `write` fills a temporary file in the same folder,
/// which then replaces `path`. The new file keeps the permissions of the one it replaces, else
/// gets rw-r--r--. A `path` that is not a file (a device, a FIFO, `/dev/stdout`) is written in
/// place; a symbolic link to anything else is refused ([`refused_link`]), and the rename
/// replaces `path` itself, never what a link put there since points at.
pub fn write_atomically<T>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> Result<T>,
) -> Result<T> {
    let name = path.display().to_string();
    if let Some(why) = refused_link(path) {
        bail!("{name}: {why}");
    }
    // A device, a FIFO, a socket (`/dev/stdout` into a pipe, `/dev/null`): nothing to replace,
    // and a rename would put a regular file in the device's place. Written in place, as a shell
    // redirection writes it.
    if written_in_place(path) {
        let mut w = BufWriter::new(create_streamed(path)?);
        let value = write(&mut w)?;
        w.flush().with_context(|| format!("{name}: cannot write"))?;
        return Ok(value);
    }
    // A rename needs only the folder's permission: a file the user may not write would be
    // replaced all the same (trace --out, which writes in place, is refused). Asked first.
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("{name}: cannot write"))?;
    }
    let dir = folder_of(path);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", path.file_name().unwrap_or_default().to_string_lossy()))
        .suffix(".unmask-tmp")
        .tempfile_in(dir)
        .map_err(|e| folder_error(&name, dir, &e))?;
    let tmp_path = tmp.path().to_path_buf();
    UNFINISHED.lock().unwrap_or_else(|e| e.into_inner()).push(tmp_path.clone());
    let result = (|| {
        let perms = std::fs::metadata(path).map(|m| m.permissions()).unwrap_or_else(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::Permissions::from_mode(0o644)
        });
        let mut w = BufWriter::new(
            tmp.reopen()
                .map_err(|e| anyhow::anyhow!("{name}: cannot write: {}", without_temp_path(&e)))?,
        );
        let value = write(&mut w)?;
        let f = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("{name}: cannot write"))?;
        f.sync_all().with_context(|| format!("{name}: cannot write"))?;
        tmp.as_file()
            .set_permissions(perms)
            .with_context(|| format!("{name}: cannot set permissions"))?;
        tmp.persist(path)
            .map_err(|e| e.error)
            .with_context(|| format!("{name}: cannot replace"))?;
        Ok(value)
    })();
    forget(&tmp_path);
    result
}

/// `--json` of a command that prints its own results on stdout (`bench`, `check-device`): a
/// file, not `-` (the JSON and the results would interleave).
pub fn check_report_path(command: &str, path: &Path) -> Result<()> {
    if is_stdout(path) {
        bail!("--json -: {command} prints its results on stdout; name a file for the JSON");
    }
    Ok(())
}

/// `value` as pretty JSON into `path`, whole or not at all ([`write_atomically`]).
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    write_atomically(path, |w| {
        serde_json::to_writer_pretty(w, value)
            .with_context(|| format!("{}: cannot write", path.display()))
    })
}

/// Writes a command's whole result to stdout in one write whose error is returned: a closed
/// pipe then ends the command quietly (main.rs) and a full disk with one line, where print!
/// panics.
pub fn print(text: &str) -> Result<()> {
    std::io::stdout().lock().write_all(text.as_bytes()).context("stdout")
}

/// Creates (or truncates) a streamed output, written in place; a symbolic link is refused
/// ([`refused_link`]), also one put there since the outputs were checked (`O_NOFOLLOW`).
pub fn create_streamed(path: &Path) -> Result<std::fs::File> {
    if let Some(why) = refused_link(path) {
        bail!("{}: {why}", path.display());
    }
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create(true).truncate(true);
    #[cfg(target_os = "linux")]
    if !written_in_place(path) {
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NOFOLLOW);
    }
    open.open(path).map_err(|e| {
        // the folder's fault said as every output says it ("the folder nodir does not exist")
        let dir = folder_of(path);
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {
                anyhow::Error::new(e).context(format!("{}: cannot create", path.display()))
            }
            _ => folder_error(&path.display().to_string(), dir, &e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn err(r: Result<()>) -> String {
        format!("{:#}", r.unwrap_err())
    }

    #[test]
    fn the_same_file_by_any_name_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.jsonl");
        std::fs::write(&a, "x").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let hard = d.path().join("hard");
        std::fs::hard_link(&a, &hard).unwrap();
        let dotted = d.path().join(".").join("a.jsonl");
        for out in [&a, &link, &hard, &dotted] {
            let e = err(refuse_clashes(&[("--out", out)], &[("trace", &a)]));
            assert_eq!(
                e,
                format!(
                    "{}: --out would overwrite the trace ({}); choose another path",
                    out.display(),
                    a.display()
                )
            );
        }
        let other = d.path().join("b.csv");
        refuse_clashes(&[("--out", &other)], &[("trace", &a)]).unwrap();
    }

    #[test]
    fn two_outputs_may_not_be_one_file_even_before_it_exists() {
        let d = tempfile::tempdir().unwrap();
        let o = d.path().join("o");
        let again = d.path().join("sub/../o");
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let e = err(refuse_clashes(&[("--cast", &o), ("--trace", &again)], &[]));
        assert_eq!(
            e,
            format!("{}: --trace and --cast are the same file; choose two paths", again.display())
        );
        refuse_clashes(&[("--cast", &o), ("--trace", &d.path().join("p"))], &[]).unwrap();
    }

    #[test]
    fn a_dash_is_stdout_and_stdin_never_a_file_but_two_outputs_cannot_share_stdout() {
        let dash = Path::new("-");
        refuse_clashes(&[("--out", dash)], &[("trace", dash), ("--prompt-file", dash)]).unwrap();
        let e = err(refuse_clashes(&[("--cast", dash), ("--trace", dash)], &[]));
        assert_eq!(e, "--trace - and --cast - would both write to stdout; give one of them a file");
        check_writable("--cast", dash).unwrap();
    }

    #[test]
    fn check_writable_refuses_what_an_atomic_write_would_fail_on() {
        let d = tempfile::tempdir().unwrap();
        let e = err(check_writable("--cast", d.path()));
        assert_eq!(e, format!("--cast {}: is a folder; name a file", d.path().display()));
        let missing = d.path().join("no/such/x.cast");
        let e = err(check_writable("--cast", &missing));
        assert!(
            e.starts_with(&format!("--cast {}: the folder", missing.display()))
                && e.ends_with("does not exist"),
            "{e}"
        );
        let file = d.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let under_a_file = file.join("x.cast");
        assert!(err(check_writable("--cast", &under_a_file)).contains("is not a folder"));
        check_writable("--cast", &d.path().join("new.cast")).unwrap();
        check_writable("--cast", &file).unwrap();
        check_writable("--cast", Path::new("/dev/null")).unwrap();
        let left: Vec<_> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("f")], "nothing created, nothing left");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x", "not truncated");
    }

    #[test]
    fn an_atomic_write_replaces_whole_or_leaves_the_old_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.csv");
        std::fs::write(&p, "old").unwrap();
        let e = write_atomically::<()>(&p, |w| {
            w.write_all(b"half")?;
            bail!("failed midway")
        });
        assert_eq!(format!("{:#}", e.unwrap_err()), "failed midway");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        write_atomically(&p, |w| Ok(w.write_all(b"new")?)).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let left: Vec<_> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("out.csv")], "no temporary file left");
    }

    /// Every error of an output names the user's path, never the temporary file's random name
    /// (`nodir/.x.csv.L8Kw36.unmask-tmp`): a missing folder is one that does not exist.
    #[test]
    fn a_missing_folder_is_named_not_the_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nodir/x.csv");
        let e =
            format!("{:#}", write_atomically(&missing, |w| Ok(w.write_all(b"x")?)).unwrap_err());
        assert_eq!(
            e,
            format!(
                "{}: the folder {} does not exist",
                missing.display(),
                d.path().join("nodir").display()
            )
        );
        let file = d.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let under_a_file = file.join("x.csv");
        let e = format!(
            "{:#}",
            write_atomically(&under_a_file, |w| Ok(w.write_all(b"x")?)).unwrap_err()
        );
        assert_eq!(e, format!("{}: {} is not a folder", under_a_file.display(), file.display()));
        let rel = Path::new("nodir-unmask-test/x.csv");
        let e = format!("{:#}", write_atomically(rel, |w| Ok(w.write_all(b"x")?)).unwrap_err());
        assert_eq!(e, "nodir-unmask-test/x.csv: the folder nodir-unmask-test does not exist");
        for e in [&e, &format!("{:#}", check_writable("--cast", &under_a_file).unwrap_err())] {
            assert!(!e.contains("unmask-tmp") && !e.contains(".unmask-check"), "{e}");
        }
    }

    /// An output that is a symbolic link to a file, a folder or nothing is refused by every
    /// writer, before anything is opened: what it points at is neither truncated nor replaced,
    /// and the link stays.
    #[test]
    fn an_output_that_is_a_symlink_is_refused_and_what_it_points_at_untouched() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("real.cast");
        std::fs::write(&target, "old").unwrap();
        let to_file = d.path().join("link.cast");
        std::os::unix::fs::symlink(&target, &to_file).unwrap();
        let dangling = d.path().join("dangling.cast");
        std::os::unix::fs::symlink(d.path().join("new.cast"), &dangling).unwrap();
        let to_dir = d.path().join("dir-link");
        std::os::unix::fs::symlink(d.path(), &to_dir).unwrap();
        for link in [&to_file, &dangling, &to_dir] {
            let why = refused_link(link).expect("refused");
            assert!(why.starts_with("is a symbolic link (to ") && why.ends_with("; outputs are not written through links: name the file itself, or remove the link"), "{why}");
            assert_eq!(
                err(check_writable("--cast", link)),
                format!("--cast {}: {why}", link.display())
            );
            let e = write_atomically(link, |w| Ok(w.write_all(b"new")?)).unwrap_err();
            assert_eq!(format!("{e:#}"), format!("{}: {why}", link.display()));
            assert_eq!(
                format!("{:#}", create_streamed(link).unwrap_err()),
                format!("{}: {why}", link.display())
            );
            assert!(std::fs::symlink_metadata(link).unwrap().file_type().is_symlink());
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        assert!(!d.path().join("new.cast").exists(), "nothing created where the link points");
        // a link planted after the check: the in-place open does not follow it, the rename
        // replaces the link itself
        #[cfg(target_os = "linux")]
        {
            let mut open = std::fs::OpenOptions::new();
            open.write(true).create(true).truncate(true);
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NOFOLLOW);
            assert!(open.open(&to_file).is_err());
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        }
    }

    /// The process's own descriptors are written in place whatever they are: `--out
    /// /dev/stdout > file` writes the file the shell opened.
    #[test]
    fn the_processs_descriptors_are_written_in_place() {
        assert!(refused_link(Path::new("/dev/stdout")).is_none());
        assert!(written_in_place(Path::new("/dev/stdout")));
        assert!(written_in_place(Path::new("/proc/self/fd/1")));
        assert!(written_in_place(Path::new("/dev/null")));
        let d = tempfile::tempdir().unwrap();
        assert!(!written_in_place(&d.path().join("x")) && !written_in_place(d.path()));
    }

    /// A FIFO (as `/dev/stdout` into a pipe is) and a character device are written, not
    /// replaced: a rename put a regular file in `/dev/null`'s place.
    #[test]
    fn an_output_that_is_not_a_file_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt;
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        write_atomically(&fifo, |w| Ok(w.write_all(b"through the pipe")?)).unwrap();
        assert_eq!(reader.join().unwrap(), "through the pipe");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "still a FIFO");
        let null = d.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        write_atomically(&null, |w| Ok(w.write_all(b"gone")?)).unwrap();
        assert!(
            std::fs::metadata("/dev/null").unwrap().file_type().is_char_device(),
            "/dev/null is still a device"
        );
        assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_symlink());
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(left.iter().all(|n| !n.ends_with(".unmask-tmp")), "no temporary file: {left:?}");
        refuse_clashes(&[("--cast", Path::new("/dev/null")), ("--trace", &null)], &[]).unwrap();
    }

    /// A file the user may not write is refused, as an in-place write would be (the rename
    /// replaced it). Only meaningful for a user other than root, whom nothing refuses.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_file_the_user_may_not_write_is_not_replaced() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("SKIPPED: root may write any file");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ro.csv");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = format!("{:#}", write_atomically(&p, |w| Ok(w.write_all(b"new")?)).unwrap_err());
        assert!(e.contains("cannot write") && e.contains("ermission denied"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
    }
}
