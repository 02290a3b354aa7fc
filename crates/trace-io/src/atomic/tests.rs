use std::io;
use std::path::Path;

use super::{OutputSet, TEMP_PREFIX, remove_stale_temporaries, write_atomic};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn temporaries(dir: &Path) -> Vec<String> {
    names(dir).into_iter().filter(|n| n.starts_with(TEMP_PREFIX)).collect()
}

/// The process id of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// `dir/name`, creating `dir`.
fn target_file(dir: &Path, name: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    dir.join(name)
}

#[test]
fn a_failing_fill_leaves_neither_the_file_nor_a_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("out.json");
    let e = write_atomic(&p, |w| {
        w.write_all(b"half")?;
        Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
    })
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    write_atomic(&p, |w| w.write_all(b"whole")).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"whole");
    assert_eq!(names(dir.path()), ["out.json"]);
}

#[test]
fn a_set_replaces_the_previous_one_and_keeps_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("sweep");
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a.json", |w| w.write_all(b"a1")).unwrap();
    set.write("b.csv", |w| w.write_all(b"b1")).unwrap();
    // Nothing is in place before the commit.
    assert!(names(&target).is_empty());
    set.commit().unwrap();
    assert_eq!(names(&target), ["a.json", "b.csv"]);
    std::fs::write(target.join("report.html"), b"mine").unwrap();
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a.json", |w| w.write_all(b"a2")).unwrap();
    set.write("b.csv", |w| w.write_all(b"b2")).unwrap();
    set.commit().unwrap();
    assert_eq!(names(&target), ["a.json", "b.csv", "report.html"]);
    assert_eq!(std::fs::read(target.join("a.json")).unwrap(), b"a2");
    assert_eq!(std::fs::read(target.join("b.csv")).unwrap(), b"b2");
    assert_eq!(std::fs::read(target.join("report.html")).unwrap(), b"mine");
    assert_eq!(names(dir.path()), ["sweep"], "no staging directory left");
}

#[test]
fn a_failure_between_files_leaves_the_previous_set_whole() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out");
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a", |w| w.write_all(b"old a")).unwrap();
    set.write("b", |w| w.write_all(b"old b")).unwrap();
    set.commit().unwrap();
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a", |w| w.write_all(b"new a")).unwrap();
    let e = set.write("b", |_| Err(io::Error::new(io::ErrorKind::StorageFull, "no space"))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    drop(set);
    assert_eq!(names(&target), ["a", "b"]);
    assert_eq!(std::fs::read(target.join("a")).unwrap(), b"old a");
    assert_eq!(std::fs::read(target.join("b")).unwrap(), b"old b");
    assert_eq!(names(dir.path()), ["out"]);
}

#[test]
fn a_set_that_is_never_committed_leaves_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("new/out");
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a", |w| w.write_all(b"a")).unwrap();
    drop(set);
    assert!(!target.exists());
    assert_eq!(names(&dir.path().join("new")), Vec::<String>::new());
}

#[test]
fn a_second_writer_fails_at_once_while_the_first_holds_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out");
    let first = OutputSet::begin(&target).unwrap();
    let e = OutputSet::begin(&target).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
    assert!(e.to_string().contains("is being written by another moe-offload process"), "{e}");
    drop(first);
    OutputSet::begin(&target).unwrap().commit().unwrap();
}

#[test]
fn stale_temporaries_of_a_dead_process_are_removed_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_pid();
    let stale_dir = dir.path().join(format!("{TEMP_PREFIX}{dead}-0x1-out"));
    std::fs::create_dir(&stale_dir).unwrap();
    std::fs::write(stale_dir.join("results.json"), b"partial").unwrap();
    let stale_file = dir.path().join(format!("{TEMP_PREFIX}{dead}-1x2-trace.safetensors"));
    std::fs::write(&stale_file, b"partial").unwrap();
    // Ours (this process is alive) and a name that is not a temporary stay.
    let ours = dir.path().join(format!("{TEMP_PREFIX}{}-9x9-x", std::process::id()));
    std::fs::write(&ours, b"in use").unwrap();
    std::fs::write(dir.path().join(".moe-offload-tmp"), b"not ours").unwrap();
    assert_eq!(remove_stale_temporaries(dir.path()), 2);
    assert_eq!(names(dir.path()).len(), 2);
    assert!(ours.exists());
    // The next writer into the directory removes them too.
    std::fs::write(&stale_file, b"partial").unwrap();
    write_atomic(&dir.path().join("x.json"), |w| w.write_all(b"{}")).unwrap();
    assert!(!stale_file.exists());
    assert_eq!(temporaries(dir.path()).len(), 1, "only this process's own");
}

#[test]
fn a_subdirectory_that_is_not_part_of_the_set_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out");
    std::fs::write(target_file(&target, "a"), b"old").unwrap();
    let mut set = OutputSet::begin(&target).unwrap();
    set.write("a", |w| w.write_all(b"new")).unwrap();
    // A directory appearing during the run is refused at the commit...
    std::fs::create_dir(target.join("maps")).unwrap();
    let e = set.commit().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::DirectoryNotEmpty);
    assert!(e.to_string().contains("holds the directory maps"), "{e}");
    // ... and one already there at the start, at once.
    let e = OutputSet::begin(&target).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::DirectoryNotEmpty);
    assert_eq!(std::fs::read(target.join("a")).unwrap(), b"old");
    assert_eq!(names(dir.path()), ["out"]);
}

#[test]
fn names_that_are_not_plain_or_repeat_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = OutputSet::begin(&dir.path().join("out")).unwrap();
    for bad in ["../x", "a/b", "", "."] {
        assert_eq!(set.write(bad, |_| Ok(())).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad:?}");
    }
    set.write("a", |_| Ok(())).unwrap();
    assert_eq!(set.write("a", |_| Ok(())).unwrap_err().kind(), io::ErrorKind::InvalidInput);
}

/// `-o /dev/null`, `-o /dev/stdout` on a pipe: a target that is a FIFO (a device behaves the
/// same) gets the contents written into it, and stays what it is; renaming a temporary over it
/// would replace it with a regular file. No temporary is left beside it or in the system's
/// temporary directory.
#[cfg(unix)]
#[test]
fn a_fifo_target_is_written_into_not_replaced() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let pid = std::process::id().to_string();
    let ours = |d: &Path| temporaries(d).into_iter().filter(|n| n.contains(&format!("-{pid}-"))).count();
    let before_tmp = ours(&std::env::temp_dir());
    for (i, expect) in [&b"{\"a\": 1}\n"[..], &b"second,file\n"[..]].into_iter().enumerate() {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                std::fs::File::open(&fifo).unwrap().read_to_end(&mut got).unwrap();
                got
            })
        };
        if i == 0 {
            write_atomic(&fifo, |w| w.write_all(expect)).unwrap();
        } else {
            super::write_atomic_files(&[(&fifo, expect)]).unwrap();
        }
        // Before the join: a replaced FIFO would leave the reader waiting for a writer forever.
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
        assert_eq!(reader.join().unwrap(), expect);
    }
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert_eq!(ours(&std::env::temp_dir()), before_tmp);
}
