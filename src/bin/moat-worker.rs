//! `moat-worker`: the process `moat exec --class worker` (and, later, a
//! runner) starts inside a namespace sandbox to run WebAssembly
//! components. Built with `moat` so that one build has both; `moat` itself
//! links none of wasmtime.

fn main() -> std::process::ExitCode {
    moat_worker::cli::main()
}
