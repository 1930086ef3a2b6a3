fn main() {
    // Debug info gives elements their ids for the testing backend's element queries
    // (tests/window.rs); it costs a little binary size, and only in debug builds.
    let debug = std::env::var("PROFILE").is_ok_and(|p| p == "debug");
    let config = slint_build::CompilerConfiguration::new().with_debug_info(debug);
    slint_build::compile_with_config("ui/app.slint", config).expect("ui/app.slint compiles");
}
