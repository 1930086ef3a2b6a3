//! `pteria models list | download ID | rm ID | path ID`: the catalog, the cache and downloads.
//! IDs are `MODEL` or `MODEL:VARIANT`; without a variant, download picks this device's default.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{DecimalBytes, MultiProgress, ProgressBar, ProgressStyle};
use pteria::catalog::{self, Catalog, DeviceFacts, Model, Variant};
use pteria::download::{
    Cache, CancelToken, DownloadError, DownloadOptions, Downloader, HubConfig, LocalModel, Progress,
};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// The catalog: every variant, whether it is downloaded, this device's default, memory fit.
    List,
    /// Download MODEL or MODEL:VARIANT (resumes an interrupted download).
    Download { id: String },
    /// Delete MODEL:VARIANT, or every downloaded variant of MODEL.
    Rm { id: String },
    /// Print the path of a downloaded model's program (.pte).
    Path { id: String },
}

pub fn run(args: Args) -> Result<()> {
    let catalog = Catalog::builtin()?;
    let cache = Cache::default_location()?;
    match args.command {
        Command::List => list(&catalog, &cache),
        Command::Download { id } => download(&catalog, cache, &id),
        Command::Rm { id } => remove(&catalog, &cache, &id),
        Command::Path { id } => path(&catalog, &cache, &id),
    }
}

/// Where bundled models live: the chat core's lookup (`PTERIA_ASSETS`, then beside/above the
/// executable, then the source tree).
pub fn assets_dir() -> PathBuf {
    pteria::chat::default_assets_dir()
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

fn describe_device(facts: &DeviceFacts) -> String {
    let mut parts = vec![format!("{:?}", facts.os)];
    if facts.gpus.is_empty() {
        parts.push("no GPU adapter".into());
    }
    for g in &facts.gpus {
        parts.push(format!(
            "{:?} {} ({}, {:?}{})",
            g.api,
            g.name,
            g.vendor(),
            g.device_type,
            if g.driver.is_empty() {
                String::new()
            } else {
                format!(", driver {}", g.driver)
            }
        ));
    }
    match facts.memory {
        Some(m) => parts.push(format!(
            "{} of {} memory available",
            gb(m.available_bytes),
            gb(m.total_bytes)
        )),
        None => parts.push("available memory unknown".into()),
    }
    let mut text = parts.join("; ");
    for note in &facts.notes {
        text.push_str(&format!("\n  note: {note}"));
    }
    text
}

fn list(catalog: &Catalog, cache: &Cache) -> Result<()> {
    let facts = catalog::probe();
    let assets = assets_dir();
    println!("device: {}", describe_device(&facts));
    println!(
        "cache:  {} ({} on disk)",
        cache.root().display(),
        gb(cache.total_bytes()?)
    );
    for model in catalog.models() {
        println!();
        let origin = match &model.source {
            catalog::Source::Hub { repo, revision } => format!("{repo} @ {revision}"),
            catalog::Source::Bundled { dir } => {
                format!("bundled in {}", assets.join(dir).display())
            }
        };
        println!("{}  {}  ({origin})", model.id, model.name);
        let default = catalog::choose(model, &facts, catalog.gpu_deny(), None)?;
        for variant in &model.variants {
            let (status, weights) = variant_status(cache, &assets, model, variant)?;
            let gpu = variant
                .backend
                .gpu_api()
                .and_then(|api| facts.gpus.iter().find(|g| g.api == api));
            let fit = catalog::estimate(model, variant, model.context_length, gpu, &facts, weights);
            let mark = if default.variant.id == variant.id {
                "*"
            } else {
                " "
            };
            println!(
                "  {mark} {:<14} {:<8} {:<6} ≈{:<8} {status}",
                variant.id,
                variant.backend.name(),
                variant.quantization,
                gb(variant.approx_bytes),
            );
            println!("      fit {fit}");
        }
        println!("  * default here: {}", default.reason);
    }
    Ok(())
}

/// "downloaded", "partial", "not downloaded" (or a bundled model's availability), and the real
/// size of the program when it is on disk.
fn variant_status(
    cache: &Cache,
    assets: &std::path::Path,
    model: &Model,
    variant: &Variant,
) -> Result<(String, Option<u64>)> {
    if model.is_bundled() {
        return Ok(match model.bundled_dir(variant, assets) {
            Some(dir) => {
                let size = std::fs::metadata(dir.join(&variant.file))
                    .map(|m| m.len())
                    .ok();
                ("available (bundled)".into(), size)
            }
            None => (
                "missing: the bundled files are not in this build".into(),
                None,
            ),
        });
    }
    if let Some(local) = cache.local_model(model, variant)? {
        let program = std::fs::metadata(&local.program).map(|m| m.len()).ok();
        return Ok((format!("downloaded, {}", gb(local.bytes)), program));
    }
    let partial = cache.partial_bytes(model, variant);
    if partial > 0 {
        return Ok((format!("partial, {} so far", gb(partial)), None));
    }
    Ok(("not downloaded".into(), None))
}

fn download(catalog: &Catalog, cache: Cache, id: &str) -> Result<()> {
    let (model, explicit) = catalog.resolve(id)?;
    if model.is_bundled() {
        bail!(
            "`{}` ships with the app; there is nothing to download",
            model.id
        );
    }
    let variant = match explicit {
        Some(v) => v,
        None => {
            let facts = catalog::probe();
            let choice = catalog::choose(model, &facts, catalog.gpu_deny(), None)?;
            eprintln!("{} ({})", model.spec(choice.variant), choice.reason);
            choice.variant
        }
    };
    if let Some(local) = cache.local_model(model, variant)? {
        println!(
            "{} is already downloaded: {}",
            model.spec(variant),
            local.program.display()
        );
        return Ok(());
    }

    let downloader = Downloader::new(cache, HubConfig::from_env(), DownloadOptions::default())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let local = runtime.block_on(async {
        let cancel = CancelToken::new();
        let on_interrupt = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_interrupt.cancel();
            }
        });
        let bars = Bars::new(&model.spec(variant));
        let result = downloader
            .download(model, variant, &cancel, &mut |p| bars.update(p))
            .await;
        bars.finish();
        result
    });
    match local {
        Ok(local) => {
            print_downloaded(model, variant, &local);
            Ok(())
        }
        Err(DownloadError::Cancelled) => {
            bail!("download cancelled; run the same command to resume")
        }
        Err(e) => Err(e.into()),
    }
}

fn print_downloaded(model: &Model, variant: &Variant, local: &LocalModel) {
    println!(
        "downloaded {} ({}): {}",
        model.spec(variant),
        gb(local.bytes),
        local.program.display()
    );
}

/// A bar for the whole model and one for the file in flight.
struct Bars {
    _multi: MultiProgress,
    model: ProgressBar,
    file: ProgressBar,
}

impl Bars {
    fn new(spec: &str) -> Bars {
        let multi = MultiProgress::new();
        let style = |template: &str| {
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ")
        };
        let model = multi.add(ProgressBar::new(0));
        model.set_style(style(
            "{prefix} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {msg}",
        ));
        model.set_prefix(spec.to_string());
        let file = multi.add(ProgressBar::new(0));
        file.set_style(style(
            "  {prefix} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {wide_msg}",
        ));
        model.enable_steady_tick(Duration::from_millis(250));
        Bars {
            _multi: multi,
            model,
            file,
        }
    }

    fn update(&self, p: &Progress) {
        self.model.set_length(p.total);
        self.model.set_position(p.done);
        let eta = match p.eta() {
            Some(eta) => format!("ETA {}", indicatif::HumanDuration(eta)),
            None => "ETA unknown".into(),
        };
        self.model
            .set_message(format!("{}/s, {eta}", DecimalBytes(p.bytes_per_sec as u64)));
        self.file
            .set_prefix(format!("file {}/{}", p.file_index + 1, p.file_count));
        self.file.set_length(p.file_total);
        self.file.set_position(p.file_done);
        self.file.set_message(p.file.clone());
    }

    fn finish(&self) {
        self.file.finish_and_clear();
        self.model.finish_and_clear();
    }
}

fn remove(catalog: &Catalog, cache: &Cache, id: &str) -> Result<()> {
    let (model, explicit) = catalog.resolve(id)?;
    if model.is_bundled() {
        bail!("`{}` ships with the app and cannot be deleted", model.id);
    }
    let targets: Vec<&Variant> = match explicit {
        Some(v) => vec![v],
        None => model
            .variants
            .iter()
            .filter(|v| {
                cache.local_model(model, v).ok().flatten().is_some()
                    || cache.partial_bytes(model, v) > 0
            })
            .collect(),
    };
    if targets.is_empty() {
        bail!("nothing of `{}` is downloaded", model.id);
    }
    for variant in targets {
        let freed = cache.remove(model, variant)?;
        println!("deleted {} ({} freed)", model.spec(variant), gb(freed));
    }
    Ok(())
}

fn path(catalog: &Catalog, cache: &Cache, id: &str) -> Result<()> {
    let (model, explicit) = catalog.resolve(id)?;
    if model.is_bundled() {
        let variant = explicit.unwrap_or(&model.variants[0]);
        let assets = assets_dir();
        let dir = model.bundled_dir(variant, &assets).ok_or_else(|| {
            anyhow!(
                "the bundled files of `{}` are not in {}",
                model.id,
                assets.display()
            )
        })?;
        println!("{}", dir.join(&variant.file).display());
        return Ok(());
    }
    let local = match explicit {
        Some(variant) => cache.local_model(model, variant)?.ok_or_else(|| {
            anyhow!(
                "`{0}` is not downloaded; run `pteria models download {0}`",
                model.spec(variant)
            )
        })?,
        None => cached_default(catalog, cache, model)?,
    };
    println!("{}", local.program.display());
    Ok(())
}

/// The downloaded variant to use when the user named none: the only one, else this device's
/// default if it is among them, else the first.
fn cached_default(catalog: &Catalog, cache: &Cache, model: &Model) -> Result<LocalModel> {
    let mut cached = Vec::new();
    for v in &model.variants {
        if let Some(local) = cache.local_model(model, v)? {
            cached.push(local);
        }
    }
    if cached.len() > 1 {
        let facts = catalog::probe();
        let choice = catalog::choose(model, &facts, catalog.gpu_deny(), None)?;
        if let Some(i) = cached
            .iter()
            .position(|l| l.variant_id == choice.variant.id)
        {
            return Ok(cached.swap_remove(i));
        }
    }
    cached.into_iter().next().ok_or_else(|| {
        anyhow!(
            "no variant of `{0}` is downloaded; run `pteria models download {0}`",
            model.id
        )
    })
}
