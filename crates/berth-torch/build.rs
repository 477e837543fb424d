//! Compiles the alloc hook's failure path (`src/oom.cpp`, `Note [Raising from the alloc hook]`).
fn main() {
    println!("cargo:rerun-if-changed=src/oom.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/oom.cpp")
        .warnings(true)
        .compile("berth_torch_oom");
    println!("cargo:rustc-link-lib=dl");
}
