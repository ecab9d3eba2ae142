//! `moat worker build`: a WebAssembly component for the worker class from
//! Python (componentize-py) or JavaScript (jco with componentize-js), both
//! installed from their registries (PyPI, npm), never a downloaded
//! toolchain. The component targets `moat:worker/command`, whose WIT this
//! binary carries.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sha2::{Digest, Sha256};

const EXAMPLES: &str = "\
Examples:
  moat worker build job.py                 # -> job.wasm
  moat worker build handler.js -o handler.wasm
  moat worker wit ./wit                    # the WIT, to write a guest against

A Python worker is a module with a `Run` class implementing `wasi:cli/run`:

  from wit_world import exports
  from wit_world.imports import inputs, outputs

  class Run(exports.Run):
      def run(self) -> None:
          outputs.write(\"out.txt\", inputs.read(\"in.txt\").upper())

A JavaScript worker exports `run`:

  import { read } from 'moat:worker/inputs@0.1.0';
  import { write } from 'moat:worker/outputs@0.1.0';
  export const run = { run() { write('out.txt', read('in.txt')); } };

The tools: componentize-py (pip install componentize-py==0.25.1) and jco
(npm install @bytecodealliance/jco@1.10.2 @bytecodealliance/componentize-js@0.18.1),
found on PATH or named by --componentize-py / --jco (MOAT_COMPONENTIZE_PY,
MOAT_JCO). Moat signs nothing here: it prints the SHA-256 of the source and
of the component, which is what a manifest or `moat exec` names.";

/// Build and inspect worker components.
#[derive(Args)]
#[command(after_long_help = EXAMPLES, after_help = "Run `moat worker --help` for examples.")]
pub struct WorkerArgs {
    #[command(subcommand)]
    command: WorkerCommand,
}

#[derive(Subcommand)]
enum WorkerCommand {
    /// Build a component from a Python (.py) or JavaScript (.js, .mjs) file.
    Build(BuildArgs),
    /// Write the WIT a worker is built against into DIR.
    Wit {
        /// A directory (made if missing).
        dir: PathBuf,
    },
}

#[derive(Args)]
struct BuildArgs {
    /// The guest's source: a Python module (its directory is its path) or
    /// a JavaScript module.
    source: PathBuf,
    /// The component to write (default: the source with .wasm).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// componentize-py to run.
    #[arg(
        long,
        value_name = "PATH",
        env = "MOAT_COMPONENTIZE_PY",
        default_value = "componentize-py"
    )]
    componentize_py: PathBuf,
    /// jco to run.
    #[arg(long, value_name = "PATH", env = "MOAT_JCO", default_value = "jco")]
    jco: PathBuf,
}

pub fn main(args: WorkerArgs) -> ExitCode {
    let result = match args.command {
        WorkerCommand::Build(build) => self::build(&build),
        WorkerCommand::Wit { dir } => write_wit(&dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat worker: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn write_wit(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    moat_worker_api::wit::write_to(dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    println!(
        "wrote the WIT of {} into {} ({} files)",
        moat_worker_api::wit::WORLD,
        dir.display(),
        moat_worker_api::wit::FILES.len()
    );
    Ok(())
}

enum Language {
    Python,
    JavaScript,
}

fn build(args: &BuildArgs) -> anyhow::Result<()> {
    let source =
        std::path::absolute(&args.source).with_context(|| format!("{}", args.source.display()))?;
    let language = match source.extension().and_then(|e| e.to_str()) {
        Some("py") => Language::Python,
        Some("js" | "mjs") => Language::JavaScript,
        _ => bail!(
            "{}: a worker is built from a Python (.py) or JavaScript (.js, .mjs) file",
            source.display()
        ),
    };
    let source_hash = hash_file(&source)?;
    let output = match &args.output {
        Some(output) => {
            std::path::absolute(output).with_context(|| format!("{}", output.display()))?
        }
        None => source.with_extension("wasm"),
    };
    let work = tempfile_dir()?;
    let wit = work.0.join("wit");
    std::fs::create_dir(&wit).context("making the WIT directory")?;
    moat_worker_api::wit::write_to(&wit).context("writing the WIT")?;
    // The tool writes next to the output, renamed into place whole, so a
    // failed build never leaves a partial component.
    let partial = work.0.join("component.wasm");
    let mut command = match language {
        Language::Python => python(args, &source, &wit, &partial)?,
        Language::JavaScript => javascript(args, &source, &wit, &partial),
    };
    let tool = command.get_program().to_string_lossy().into_owned();
    let result = command
        .output()
        .with_context(|| format!("running {tool} (is it installed? see `moat worker --help`)"))?;
    if !result.status.success() || !partial.is_file() {
        let stderr = String::from_utf8_lossy(&result.stderr);
        let stdout = String::from_utf8_lossy(&result.stdout);
        let said: Vec<&str> = stderr.lines().chain(stdout.lines()).take(20).collect();
        bail!("{tool} failed ({}):\n{}", result.status, said.join("\n"));
    }
    check_component(&partial)?;
    std::fs::copy(&partial, &output).with_context(|| format!("writing {}", output.display()))?;
    let hash = hash_file(&output)?;
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    println!(
        "built {} ({}, sha256 {hash})\n  from {} (sha256 {source_hash}) for {}\n  run it: moat exec --class worker -- {}",
        output.display(),
        moat_core::size::format_size(size),
        source.display(),
        moat_worker_api::wit::WORLD,
        output.display()
    );
    Ok(())
}

fn python(args: &BuildArgs, source: &Path, wit: &Path, out: &Path) -> anyhow::Result<Command> {
    let module = source
        .file_stem()
        .and_then(|s| s.to_str())
        .context("the source's name is not UTF-8")?;
    // componentize-py generates `wit_world` and the world's name as modules.
    if matches!(module, "wit_world" | "command" | "componentize_py_types") {
        bail!("{module}.py: that name is taken by the generated bindings; rename the file");
    }
    let dir = source.parent().context("the source has no directory")?;
    let mut command = Command::new(&args.componentize_py);
    command
        .arg("-q")
        .arg("-d")
        .arg(wit)
        .args(["-w", moat_worker_api::wit::WORLD, "componentize", "-p"])
        .arg(dir)
        .arg(module)
        .arg("-o")
        .arg(out)
        .current_dir(dir);
    Ok(command)
}

fn javascript(args: &BuildArgs, source: &Path, wit: &Path, out: &Path) -> Command {
    let mut command = Command::new(&args.jco);
    command
        .arg("componentize")
        .arg(source)
        .arg("--wit")
        .arg(wit)
        .args(["--world-name", moat_worker_api::wit::WORLD])
        // No wasi:http: a worker's outbound HTTP is Moat's binding.
        .args(["--disable", "http"])
        .arg("-o")
        .arg(out);
    if let Some(dir) = source.parent() {
        command.current_dir(dir);
    }
    command
}

fn check_component(path: &Path) -> anyhow::Result<()> {
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .context("reading the built component")?;
    if &magic[..4] != b"\0asm" || magic[6..8] != [1, 0] {
        bail!("the tool wrote something that is not a WebAssembly component");
    }
    Ok(())
}

fn hash_file(path: &Path) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// A private directory for one build, removed with it.
struct TempDir(PathBuf);

fn tempfile_dir() -> anyhow::Result<TempDir> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("moat-worker-build-{}", moat_core::random::hex(8)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("making {}", dir.display()))?;
    Ok(TempDir(dir))
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
