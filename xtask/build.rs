//! Sets `cfg(real_data)` when `MOE_OFFLOAD_REAL_DATA` is set, so that the real-data tests run
//! then and show as ignored otherwise (see the `real-data` crate).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(real_data)");
    println!("cargo::rerun-if-env-changed=MOE_OFFLOAD_REAL_DATA");
    if std::env::var_os("MOE_OFFLOAD_REAL_DATA").is_some() {
        println!("cargo::rustc-cfg=real_data");
    }
}
