//! Atomic outputs: single files written through a temporary file renamed into place, and output
//! sets (several files in one directory) built in a staging directory and swapped into place as a
//! whole, under an advisory lock on the target.
//!
//! Every temporary file and staging directory is created beside its target under a visible
//! [`TEMP_PREFIX`] name that carries the writer's process id, and is held locked while in use.
//! It is removed when the write fails (on drop), by [`remove_temporaries`] (the CLI calls it on
//! Ctrl-C), and otherwise by the next writer into the same directory: a temporary whose process is
//! gone and whose lock is free is stale, whatever killed its writer.

use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Prefix of the name of every temporary file and staging directory moe-offload creates:
/// `.moe-offload-tmp-PID-N-TARGET` beside `TARGET`.
pub const TEMP_PREFIX: &str = ".moe-offload-tmp-";

/// The temporaries of this process in use, for [`remove_temporaries`].
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Output directories this process created and has not filled yet: removed by
/// [`remove_temporaries`] when still empty.
static CREATED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Set by [`remove_temporaries`]: no new temporary may be created after it.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Distinguishes the temporaries of one process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Removes every temporary file and staging directory this process has in use (and the output
/// directories it created for them, when still empty), and refuses new ones from then on (they fail with [`io::ErrorKind::Interrupted`]). For a signal handler thread
/// (Ctrl-C) that exits the process right after. Returns how many were removed.
pub fn remove_temporaries() -> usize {
    CLOSED.store(true, Ordering::SeqCst);
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let n = live.len();
    for p in live.drain(..) {
        remove_any(&p);
    }
    for dir in CREATED.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
        let _ = std::fs::remove_dir(dir); // only when empty
    }
    n
}

fn register(p: &Path) -> io::Result<()> {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    if CLOSED.load(Ordering::SeqCst) {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted: no new output is written"));
    }
    live.push(p.to_path_buf());
    Ok(())
}

fn unregister(p: &Path) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|q| q != p);
}

fn remove_any(p: &Path) {
    // Errors are ignored: the next run removes what is left.
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => drop(std::fs::remove_dir_all(p)),
        Ok(_) => drop(std::fs::remove_file(p)),
        Err(_) => {}
    }
}

/// The directory of `path` (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and its missing parents; an error naming the file when one of them is a file
/// (create_dir_all would report "File exists").
fn ensure_dir(dir: &Path) -> io::Result<()> {
    if let Some(file) = dir.ancestors().find(|a| a.exists()).filter(|a| !a.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is a file, not a directory", file.display()),
        ));
    }
    std::fs::create_dir_all(dir)
}

/// The file name of `target` as temporaries carry it: cut to at most 64 bytes.
fn short_name(target: &Path) -> String {
    let mut name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut cut = name.len().min(64);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    name
}

/// A fresh temporary name in `dir` for `target`: `.moe-offload-tmp-PID-N-NAME` ([`short_name`]).
fn temp_path(dir: &Path, target: &Path) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    dir.join(format!("{TEMP_PREFIX}{}-{n}x{nanos:x}-{}", std::process::id(), short_name(target)))
}

/// Whether `target` (followed through symlinks) exists and is neither a regular file nor a
/// directory: a device (`/dev/null`), a FIFO or a socket (`/dev/stdout` on a pipe). Renaming a
/// temporary over it would replace it with a regular file (as root, `-o /dev/null` would replace
/// the system's null device), so its contents are written into it instead.
fn is_special(target: &Path) -> bool {
    std::fs::metadata(target).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// The process id in a temporary's name, if it is one.
fn temp_pid(name: &str) -> Option<u32> {
    name.strip_prefix(TEMP_PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether process `pid` exists (Linux: `/proc/PID`; elsewhere unknown, so `false` and the lock
/// alone decides).
fn process_alive(pid: u32) -> bool {
    cfg!(target_os = "linux") && Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes the stale temporaries in `dir`: those of a process that is gone and whose lock is free.
/// Returns how many were removed. Errors are ignored (a temporary that cannot be removed now is
/// tried again at the next run).
pub fn remove_stale_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_pid(&name.to_string_lossy()) else { continue };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        let path = entry.path();
        // A live writer holds its temporary locked.
        let free = File::open(&path).is_ok_and(|f| f.try_lock().is_ok());
        if free {
            remove_any(&path);
            removed += 1;
        }
    }
    removed
}

/// A locked temporary file beside its target, removed on drop unless persisted.
pub(crate) struct TempFile {
    path: PathBuf,
    file: Option<File>,
    /// The target is a device, FIFO or socket ([`is_special`], decided once by
    /// [`TempFile::beside`]): [`TempFile::persist`] copies into it instead of renaming.
    copy_into: bool,
}

impl TempFile {
    /// Creates a temporary file in the directory of `target` (created with its missing parents),
    /// after removing that directory's stale temporaries; for a target that is a device, FIFO or
    /// socket ([`is_special`]), in the system's temporary directory (`/dev` is not writable for
    /// most users).
    pub(crate) fn beside(target: &Path) -> io::Result<TempFile> {
        let copy_into = is_special(target);
        let system_tmp;
        let dir = if copy_into {
            system_tmp = std::env::temp_dir();
            system_tmp.as_path()
        } else {
            parent_of(target)
        };
        ensure_dir(dir)?;
        remove_stale_temporaries(dir);
        loop {
            let path = temp_path(dir, target);
            match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                Ok(file) => {
                    let mut tmp = TempFile { path, file: None, copy_into };
                    register(&tmp.path)?;
                    file.try_lock().map_err(io::Error::from)?;
                    tmp.file = Some(file);
                    return Ok(tmp);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The open file.
    pub(crate) fn file(&self) -> &File {
        self.file.as_ref().expect("open until persisted or dropped")
    }

    /// Renames the file over `target` (the one it was created [`TempFile::beside`]); into a
    /// target that is a device, FIFO or socket it copies the contents instead (and drop removes
    /// the temporary).
    pub(crate) fn persist(mut self, target: &Path) -> io::Result<()> {
        if self.copy_into {
            let mut from: &File = self.file();
            from.seek(io::SeekFrom::Start(0))?;
            let mut to = std::fs::OpenOptions::new().write(true).open(target)?;
            io::copy(&mut from, &mut to)?;
            return to.flush();
        }
        std::fs::rename(&self.path, target)?;
        unregister(&self.path);
        self.file = None;
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.path);
            unregister(&self.path);
        }
    }
}

/// Writes a file atomically: `fill` writes the contents into a buffered temporary file in the
/// same directory as `path` (created with its missing parents first), which is then renamed over
/// `path`. On any error the temporary file is removed and `path` is untouched, so no partial
/// output is ever left behind. The file gets the usual permissions (0666 less the umask on Unix).
///
/// # Errors
/// The I/O error of creating, writing or renaming (not wrapped with the path).
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let tmp = TempFile::beside(path)?;
    {
        let mut w = BufWriter::with_capacity(1 << 20, tmp.file());
        fill(&mut w)?;
        w.flush()?;
    }
    tmp.persist(path)
}

/// Writes several files as one output (a JSON and the CSV beside it): every file's contents go
/// to a temporary file beside it first, and only when all of them are complete (written and
/// flushed) are they renamed into place, in order. A failure while writing (a full disk) leaves
/// every target untouched; a target that is a directory is refused before any rename. Unlike
/// [`OutputSet`] the files may lie in a directory shared with other files (the working
/// directory); the renames need no space, so the window between two of them is small, but it is
/// not one atomic step.
///
/// # Errors
/// [`io::ErrorKind::IsADirectory`] for a target that is a directory; the I/O error of creating,
/// writing or renaming (not wrapped with the path).
pub fn write_atomic_files(files: &[(&Path, &[u8])]) -> io::Result<()> {
    if let Some((p, _)) = files.iter().find(|(p, _)| p.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            format!("{} is a directory: the output cannot replace it", p.display()),
        ));
    }
    let mut temps = Vec::with_capacity(files.len());
    for &(path, bytes) in files {
        let tmp = TempFile::beside(path)?;
        {
            let mut w = BufWriter::with_capacity(1 << 20, tmp.file());
            w.write_all(bytes)?;
            w.flush()?;
        }
        tmp.file().sync_data()?;
        temps.push(tmp);
    }
    for (tmp, &(path, _)) in temps.into_iter().zip(files) {
        tmp.persist(path)?;
    }
    Ok(())
}

/// A set of files written into one directory as a whole: built in a staging directory beside the
/// target and swapped into place by [`OutputSet::commit`], so that the target holds either the
/// previous set or the new one, never a mix of two runs or a part of one.
///
/// [`OutputSet::begin`] takes an advisory lock on the target directory (created if missing), so a
/// second writer fails at once, naming the first; the lock is held until the set is committed or
/// dropped. Files in the target that are not part of the set (a report written beside a sweep's
/// results, say) are carried over into the new set as hard links. Dropping an uncommitted set
/// removes its staging directory.
#[derive(Debug)]
pub struct OutputSet {
    target: PathBuf,
    staging: PathBuf,
    /// Locks held: the target directory's, and the staging directory's (marks it in use).
    _locks: [File; 2],
    written: Vec<String>,
    /// Whether [`OutputSet::begin`] created the target (removed again when nothing is committed).
    created: bool,
    committed: bool,
}

impl OutputSet {
    /// Locks `target` (a directory, created with its missing parents) and creates an empty staging
    /// directory beside it, after removing stale temporaries there. A target created here is
    /// removed again when the set is dropped without a commit (if it is still empty).
    ///
    /// # Errors
    /// [`io::ErrorKind::ResourceBusy`] when another process is writing `target` (naming its process
    /// id and command line where the system tells them); [`io::ErrorKind::NotADirectory`] when
    /// `target` or one of its parents is a file; the I/O error of creating or locking.
    pub fn begin(target: &Path) -> io::Result<OutputSet> {
        let created = !target.exists();
        ensure_dir(target)?;
        let target = target.canonicalize()?;
        if created {
            CREATED.lock().unwrap_or_else(PoisonError::into_inner).push(target.clone());
        }
        let lock = File::open(&target)?;
        if let Err(e) = lock.try_lock() {
            return Err(match e {
                std::fs::TryLockError::WouldBlock => io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is being written by another moe-offload process ({}); wait for it to finish, or \
                         choose another output directory",
                        target.display(),
                        holder(&target)
                    ),
                ),
                std::fs::TryLockError::Error(e) => e,
            });
        }
        // Refused now rather than at the commit, after the work.
        if let Some(sub) = subdirectory(&target)? {
            return Err(subdirectory_error(&target, &sub));
        }
        let parent = parent_of(&target);
        remove_stale_temporaries(parent);
        let staging = temp_path(parent_of(&target), &target);
        register(&staging)?;
        let made = std::fs::create_dir(&staging).and_then(|()| {
            let f = File::open(&staging)?;
            f.try_lock().map_err(io::Error::from)?;
            Ok(f)
        });
        match made {
            Ok(staging_lock) => Ok(OutputSet {
                target,
                staging,
                _locks: [lock, staging_lock],
                written: Vec::new(),
                created,
                committed: false,
            }),
            Err(e) => {
                remove_any(&staging);
                unregister(&staging);
                Err(e)
            }
        }
    }

    /// The target directory (canonical).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The staging directory, where the files of the set are written before the commit. Files
    /// written there directly (by another writer of the project) are part of the set too.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Writes file `name` of the set: `fill` writes its contents through a buffer.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] for a name that is not a plain file name or was written
    /// before; the I/O error of `fill`, creating or flushing (the set is then unusable: drop it).
    pub fn write(&mut self, name: &str, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
        if Path::new(name).file_name().is_none_or(|n| n != name) || self.written.iter().any(|w| w == name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a new plain file name in the output set"),
            ));
        }
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(self.staging.join(name))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        fill(&mut w)?;
        w.flush()?;
        self.written.push(name.to_string());
        Ok(())
    }

    /// Puts the set in place: carries the target's other files over (hard links), then swaps the
    /// staging directory with the target (one atomic exchange on Linux; elsewhere two renames,
    /// between which the target is briefly absent) and removes the previous set.
    ///
    /// # Errors
    /// [`io::ErrorKind::DirectoryNotEmpty`] when the target holds a subdirectory that is not part
    /// of the set (it would have to be moved); the I/O error of linking or renaming. The target
    /// is unchanged on error.
    pub fn commit(mut self) -> io::Result<()> {
        for entry in std::fs::read_dir(&self.target)? {
            let entry = entry?;
            let name = entry.file_name();
            let from = entry.path();
            let to = self.staging.join(&name);
            if std::fs::symlink_metadata(&to).is_ok() {
                continue; // part of the new set
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                return Err(subdirectory_error(&self.target, &name.to_string_lossy()));
            }
            #[cfg(unix)]
            if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
                continue;
            }
            std::fs::hard_link(&from, &to)?;
        }
        swap(&self.staging, &self.target)?;
        // The staging path now holds the previous set (or nothing, after the fallback).
        self.committed = true;
        Ok(())
    }
}

impl Drop for OutputSet {
    fn drop(&mut self) {
        remove_any(&self.staging);
        unregister(&self.staging);
        if self.created {
            CREATED.lock().unwrap_or_else(PoisonError::into_inner).retain(|d| *d != self.target);
            if !self.committed {
                // Only if still empty: a directory made for an output that was never written.
                let _ = std::fs::remove_dir(&self.target);
            }
        }
    }
}

/// The name of a subdirectory of `dir`, if it has one.
fn subdirectory(dir: &Path) -> io::Result<Option<String>> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            return Ok(Some(entry.file_name().to_string_lossy().into_owned()));
        }
    }
    Ok(None)
}

fn subdirectory_error(target: &Path, name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::DirectoryNotEmpty,
        format!(
            "{} holds the directory {name}, which is not part of this output (an output directory is replaced as a \
             whole, its files carried over): move it, or choose another output directory",
            target.display()
        ),
    )
}

/// Exchanges the directories `new` and `target` (`new` then holds the old contents).
fn swap(new: &Path, target: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{CWD, RenameFlags, renameat_with};
        match renameat_with(CWD, new, CWD, target, RenameFlags::EXCHANGE) {
            Ok(()) => return Ok(()),
            // A file system without the exchange: fall back to two renames.
            Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {}
            Err(e) => return Err(e.into()),
        }
    }
    let old = temp_path(parent_of(target), target);
    register(&old)?;
    std::fs::rename(target, &old)?;
    if let Err(e) = std::fs::rename(new, target) {
        let _ = std::fs::rename(&old, target);
        unregister(&old);
        return Err(e);
    }
    remove_any(&old);
    unregister(&old);
    Ok(())
}

/// Who holds the lock on `target`: the process id and command line of the other writer's staging
/// directory, as far as the system tells them.
fn holder(target: &Path) -> String {
    let name = short_name(target);
    let others: Vec<String> = std::fs::read_dir(parent_of(target))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let entry = e.file_name().to_string_lossy().into_owned();
            let pid = temp_pid(&entry)?;
            let tail = entry.strip_prefix(TEMP_PREFIX)?.splitn(3, '-').nth(2)?;
            (pid != std::process::id() && tail == name).then_some(pid)
        })
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| {
                    b.split(|&c| c == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            if cmd.is_empty() { format!("pid {pid}") } else { format!("pid {pid}: {cmd}") }
        })
        .collect();
    if others.is_empty() { "its process id is not known".to_string() } else { others.join("; ") }
}

#[cfg(test)]
mod tests;
