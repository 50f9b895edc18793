//! The chaos soak's worker configs (each generation a reload applies),
//! its run directory, its segment prefix, and its seeded generator.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) const SHM_LIB: &str = "libshardport_posix_shm.so";
pub(super) const HTTP_LIB: &str = "libshardport_http.so";

/// A small, seeded generator (splitmix64): the same choices for the same seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % (n.max(1) as u64)) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// `mean` scaled by a factor drawn from 0.5..1.5.
    pub fn jitter(&mut self, mean: Duration) -> Duration {
        let f = 0.5 + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        mean.mul_f64(f)
    }
}

/// Owner or consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Puts and removes shards.
    Owner,
    /// Fetches them.
    Consumer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Owner => "owner",
            Role::Consumer => "consumer",
        })
    }
}

/// The configuration a worker runs at reload generation `generation`: the
/// plugins never change (their pools and servers go on), the routes, the
/// consumer cache limit and the experiment weights do.
pub fn config_text(
    opts: &ChaosOptions,
    prefix: &str,
    role: Role,
    index: usize,
    generation: u64,
    sweep_on_start: bool,
) -> String {
    let lib = |l: &str| toml_string(&opts.plugin_dir.join(l).to_string_lossy());
    let cache = match role {
        // Owners cache nothing; consumers keep views and copies in an LRU
        // cache whose limit moves with every reload (a tighter limit evicts
        // at once, which releases leases on the owners' pools).
        Role::Owner => "policy = \"none\"".to_owned(),
        Role::Consumer => format!(
            "policy = [\"lru\"]\nmax-bytes = \"{}MiB\"",
            [16, 4, 32][(generation % 3) as usize]
        ),
    };
    // The canary's share swings between small and half.
    let (control, canary) = [(95, 5), (70, 30), (50, 50), (90, 10)][(generation % 4) as usize];
    // Shards tagged `path = "network"` go over http only, or over http
    // first with shared memory as a fallback.
    let network = if generation % 2 == 0 {
        "[\"http\"]"
    } else {
        "[\"http\", \"posix-shm\"]"
    };
    format!(
        "# shardport soak --chaos: {role} {index}, reload generation {generation}.\n\
         [node]\n\
         name = \"chaos-{role}-{index}\"\n\
         advertise = \"127.0.0.1:7070\"\n\
         \n\
         [put]\n\
         storage = \"pool\"\n\
         pool-transport = \"posix-shm\"\n\
         checksum = \"none\"\n\
         \n\
         [fetch]\n\
         mode = \"view\"\n\
         on-downgrade = \"allow\"\n\
         \n\
         [cache]\n\
         {cache}\n\
         \n\
         [[plugin]]\n\
         name = \"posix-shm\"\n\
         path = {shm}\n\
         required = true\n\
         [plugin.config]\n\
         pool-size = \"{pool}MiB\"\n\
         segment-prefix = \"{prefix}\"\n\
         sweep-on-start = {sweep_on_start}\n\
         \n\
         [[plugin]]\n\
         name = \"http\"\n\
         path = {http}\n\
         required = true\n\
         [plugin.config]\n\
         bind = \"127.0.0.1:0\"\n\
         \n\
         [[experiment]]\n\
         name = \"chaos-shm-vs-http\"\n\
         local = true\n\
         device = \"cpu\"\n\
         min-size = \"256KiB\"\n\
         unit = \"shard\"\n\
         salt = \"chaos\"\n\
         arms = [\n\
         \x20 {{ name = \"control\", transport = \"posix-shm\", weight = {control} }},\n\
         \x20 {{ name = \"canary\", transport = \"http\", weight = {canary} }},\n\
         ]\n\
         \n\
         [[route]]\n\
         name = \"network\"\n\
         tags = {{ path = \"network\" }}\n\
         transports = {network}\n",
        shm = lib(SHM_LIB),
        http = lib(HTTP_LIB),
        pool = opts.pool_mib,
    )
}

/// A TOML basic string.
pub(super) fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// worker restarting at that moment reads the old file or the new one,
/// never half of one.
pub(super) fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The run's files: removed with everything in them when dropped, and the
/// run's leftover `/dev/shm` segments with them (after the report counted
/// them), so even a failed run leaves nothing behind.
pub(super) struct RunDir {
    pub(super) path: PathBuf,
    pub(super) prefix: String,
}

impl RunDir {
    pub(super) fn create(parent: &Path, prefix: &str) -> Result<RunDir, String> {
        let path = parent.join(format!("shardport-{prefix}"));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(RunDir {
            path,
            prefix: prefix.to_owned(),
        })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        for name in shm_names(&self.prefix) {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }
}

/// Names in `/dev/shm` of segments made with `prefix` (segment names are
/// `{prefix}-...`).
pub fn shm_names(prefix: &str) -> Vec<String> {
    let start = format!("{prefix}-");
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&start))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A prefix no other run uses: letters and digits only (the posix-shm
/// plugin allows `[A-Za-z0-9_-]`, at most 32 characters).
pub(super) fn run_prefix(seed: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let salt = Rng::new(nanos ^ seed.rotate_left(17)).next_u64() & 0xffff_ffff;
    format!("chaos{}x{salt:08x}", std::process::id())
}
