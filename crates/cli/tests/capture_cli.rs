//! `moe-offload capture` through the binary, in the build the tests run (python/test_capture_gguf.py
//! runs it on real GGUF models with the capture feature).

mod common;

use common::{fails, s};

#[test]
fn capture_settings_are_refused_by_flag_and_a_default_build_says_how_to_build() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "1 2 3\n").unwrap();
    let out = dir.path().join("t.safetensors");
    let run = |extra: &[&str]| {
        let mut args = vec!["capture", "model.gguf", "--tokens", s(&ids), "-o", s(&out)];
        args.extend_from_slice(extra);
        fails(&args)
    };
    let check = |extra: &[&str], expect: &str| {
        let msg = run(extra);
        assert!(msg.contains(expect), "{extra:?}: {msg}");
        assert!(!out.exists());
    };
    check(&["--ctx", "8", "--generate", "8"], "--ctx 8 leaves no room for a prompt before --generate 8");
    check(&["--batch", "0"], "--batch 0 must be in 1..=16777216");
    check(&["--threads", "0"], "--threads must be in 1..=1024");
    check(&["--candidates", "0"], "--candidates must be at least 1");
    if cfg!(feature = "capture") {
        check(&[], "model.gguf: no such file");
    } else {
        check(
            &[],
            "no llama.cpp: build it with the capture feature (`cargo build --release -p cli --features capture`",
        );
    }
    let msg = fails(&["profile", "measure", "--gguf", "model.gguf", "--repeats", "0"]);
    assert!(msg.contains("--repeats must be at least 1"), "{msg}");
    let msg = fails(&["profile", "measure", "--gguf", "model.gguf"]);
    let expect = if cfg!(feature = "capture") { "model.gguf: no such file" } else { "no llama.cpp: build it" };
    assert!(msg.contains(expect), "{msg}");
    // Neither input, or both.
    let msg = fails(&["capture", "model.gguf", "-o", s(&out)]);
    assert!(msg.contains("--text <FILE>") && msg.contains("--tokens <FILE>"), "{msg}");
}
