// flashtile: benchmark, check and run exact attention from the command line.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.hpp"
#include "flags.hpp"

namespace {

// --window and --softcap, shared by bench and run. CLI11 reads them as text; flags.hpp parses
// them strictly once CLI11 is done, so that every error names the flag.
struct VariantFlags {
  std::string window, softcap;
  CLI::Option* window_opt = nullptr;
  CLI::Option* softcap_opt = nullptr;

  void add_to(CLI::App* cmd) {
    window_opt = cmd->add_option(
        "--window", window,
        "Sliding window L,R: query i sees key j when j - (i + Sk - Sq) lies in [-L, R]; -1 = "
        "unbounded side; --causal makes R 0");
    softcap_opt = cmd->add_option("--softcap", softcap,
                                  "Logit softcap c > 0: S <- c*tanh(S/c), applied before ALiBi");
  }
  void apply_to(flashtile::Window& window_out, float& softcap_out) const {
    if (window_opt->count() > 0) window_out = flashtile::cli::parse_window(window);
    if (softcap_opt->count() > 0) softcap_out = flashtile::cli::parse_softcap(softcap);
  }
};

// Integer validators whose messages name the expected and the given value (CLI11's own
// range message prints the bounds as floating-point numbers).
CLI::Validator at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& input) -> std::string {
        long long value = 0;
        size_t used = 0;
        try {
          value = std::stoll(input, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != input.size() || input.empty()) return "expected an integer, got '" + input + "'";
        if (value < minimum)
          return "must be >= " + std::to_string(minimum) + ", got " + input;
        return "";
      },
      ">=" + std::to_string(minimum));
}
const CLI::Validator kPositive = at_least(1);
// OpenMP teams beyond this many threads are refused (the runtime crashes far above the cores).
constexpr int kMaxThreads = 1024;
CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        if (std::string why = at_least(0)(input); !why.empty()) return why;
        if (std::stoll(input) > kMaxThreads)
          return "must be 0 (all cores) or at most " + std::to_string(kMaxThreads) + ", got " + input;
        return "";
      },
      "THREADS");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashtile;
  CLI::App app{"flashtile: exact attention (FlashAttention) on CPUs and CUDA GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("flashtile ") + std::string(flashtile::version()));

  cli::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand(
      "bench", "Time every available backend on one case (default: the write-up's B=1 H=1 "
               "N=1024 d=64 fp32) or on the field's sweep grid");
  bench_cmd->footer(
      "Every row is checked against the double-precision oracle before it is timed (on "
      "12 sampled query rows when the full oracle would be too slow). TFLOP/s count 4*d "
      "FLOPs per visible (query, key) pair and query head: the field's 4*B*H*Sq*Sk*d for full "
      "attention and half of it for --causal; with --window or --varlen the pairs each row "
      "actually sees, per sequence, so rates compare across variants. Backends that cannot "
      "run a case are skipped with their reason.");
  std::string dtype = "f32";
  int64_t seqlen = 0;
  auto* batch_opt =
      bench_cmd->add_option("--batch", bench.shape.batch, "Batch size")->default_val(1)->check(kPositive);
  bench_cmd->add_option("--heads", bench.shape.heads_q, "Query heads")->default_val(1)->check(kPositive);
  bench_cmd->add_option("--heads-kv", bench.shape.heads_kv, "Key/value heads (0 = heads)")
      ->default_val(0)->check(at_least(0));
  auto* seqlen_opt =
      bench_cmd->add_option("--seqlen", seqlen, "Sets both seqlen-q and seqlen-k")->check(kPositive);
  auto* seqlen_q_opt =
      bench_cmd->add_option("--seqlen-q", bench.shape.seqlen_q, "Query length")->default_val(1024)->check(kPositive);
  auto* seqlen_k_opt = bench_cmd->add_option("--seqlen-k", bench.shape.seqlen_k, "Key/value length")
                           ->default_val(1024)->check(kPositive);
  bench_cmd->add_option("--head-dim", bench.shape.head_dim, "Head dimension")->default_val(64)->check(kPositive);
  bench_cmd->add_flag("--causal", bench.shape.causal, "Causal mask (bottom-right aligned)");
  bench_cmd->add_option("--dtype", dtype, "f32, f16 or bf16")->default_val("f32");
  VariantFlags bench_variant;
  bench_variant.add_to(bench_cmd);
  bench_cmd->add_flag("--alibi", bench.values.standard_alibi,
                      "ALiBi with the standard slopes 2^(-8(h+1)/H) of BLOOM and MPT (H not a "
                      "power of two: those of the power of two n below H, then every other "
                      "slope of 2n heads)");
  std::string bench_sinks;
  auto* bench_sinks_opt =
      bench_cmd
          ->add_option("--sinks", bench_sinks,
                       "Attention sinks, one logit per query head: 'random' (uniform in [-2, 2], "
                       "fixed seed; what --sinks alone means) or a number that every head takes")
          ->expected(0, 1)
          ->default_str("random");  // the value of a bare --sinks
  std::string bench_varlen;
  auto* varlen_opt = bench_cmd->add_option(
      "--varlen", bench_varlen,
      "A packed varlen batch instead of --batch/--seqlen*: sequence lengths N1,N2,... (an entry "
      "Q/K gives Q queries and K keys; 0 is an empty sequence), or random:MIN-MAX:TOTAL "
      "(lengths uniform in [MIN, MAX], fixed seed, until TOTAL tokens; the last is cut to fit)");
  varlen_opt->excludes(batch_opt)->excludes(seqlen_opt)->excludes(seqlen_q_opt)->excludes(seqlen_k_opt);
  bench_cmd->add_option("--backends", bench.backends, "Comma-separated backends (default: all)")
      ->delimiter(',');
  bench_cmd->add_option("--warmup", bench.warmup, "Untimed calls first")->default_val(3)->check(at_least(0));
  bench_cmd->add_option("--repeats", bench.repeats, "Timed calls (median reported)")
      ->default_val(20)->check(kPositive);
  bench_cmd->add_option("--threads", bench.threads, "CPU threads (0 = all)")->default_val(0)
      ->check(thread_count());
  std::string bench_pass = "fwd";
  bench_cmd->add_option("--pass", bench_pass,
                        "fwd (forward), bwd (backward, from the backend's own forward out and "
                        "lse) or fwdbwd (both, timed together); bwd FLOPs are 2.5x fwd's")
      ->default_val("fwd")->check(CLI::IsMember({"fwd", "bwd", "fwdbwd"}));
  bench_cmd->add_flag("--json", bench.json, "Print a JSON list instead of the table");
  bench_cmd->add_option("--output", bench.output, "Also write the results to FILE (.json or .csv)");
  bench_cmd->add_flag("--no-flush", bench.no_flush, "Do not flush the GPU L2 before timed calls");
  bench_cmd->add_flag("--isolated", bench.isolated,
                      "GPU: wait for the device before each timed call, so that its time includes "
                      "the host's path to the launch (default: calls queued back to back, as "
                      "triton.testing.do_bench times the PyTorch peers)");
  auto* sweep_opt =
      bench_cmd->add_flag("--sweep", bench.sweep,
                          "Run the field's grid: 16k tokens (batch = 16384/seqlen), hidden 2048 "
                          "(heads = 2048/head_dim), the variant flags applied to every shape");
  varlen_opt->excludes(sweep_opt);
  bench_cmd->add_option("--sweep-seqlens", bench.sweep_seqlens, "Sweep seqlens")->delimiter(',')
      ->check(kPositive);
  bench_cmd->add_option("--sweep-head-dims", bench.sweep_head_dims, "Sweep head dims")
      ->delimiter(',')->check(kPositive);
  bench_cmd->add_option("--sweep-causal", bench.sweep_causal, "Sweep causal values (0,1)")
      ->delimiter(',')->check(CLI::IsMember({"0", "1"}));

  cli::CheckOptions check;
  auto* check_cmd = app.add_subcommand(
      "check", "Check every available backend against the double-precision oracle on random "
               "shapes; exits non-zero on any failure");
  check_cmd->add_option("--shapes", check.shapes, "Random shapes per backend")
      ->default_val(200)->check(kPositive);
  check_cmd->add_option("--seed", check.seed, "Random seed")->default_val(2024);
  check_cmd->add_option("--max-seqlen", check.max_seqlen, "Longest sequence drawn")
      ->default_val(300)->check(kPositive);
  check_cmd->add_option("--backends", check.backends, "Comma-separated backends (default: all)")
      ->delimiter(',');
  check_cmd->add_option("--threads", check.threads, "CPU threads (0 = all)")->default_val(0)
      ->check(thread_count());
  std::string check_pass = "fwd";
  check_cmd->add_option("--pass", check_pass,
                        "fwd: outputs and LSE against the oracle; bwd: dq, dk, dv (and dsinks) "
                        "against the oracle's gradients, for the backends with a backward")
      ->default_val("fwd")->check(CLI::IsMember({"fwd", "bwd"}));

  cli::RunOptions run;
  auto* run_cmd = app.add_subcommand(
      "run", "Attention on .npy files: float32, float16 or ml_dtypes.bfloat16, C order, "
             "shape (B, S, H, D), or packed (total_tokens, H, D) with --cu-seqlens-q/k");
  run_cmd->add_option("--q", run.q, "Query .npy")->required();
  run_cmd->add_option("--k", run.k, "Key .npy")->required();
  run_cmd->add_option("--v", run.v, "Value .npy")->required();
  run_cmd->add_option("--out", run.out, "Output .npy (written only on success)")->required();
  run_cmd->add_option("--lse", run.lse,
                      "Also write the log-sum-exp, float32 (B, H, Sq), or (H, total_q) varlen");
  run_cmd->add_flag("--causal", run.causal, "Causal mask (bottom-right aligned)");
  VariantFlags run_variant;
  run_variant.add_to(run_cmd);
  run_cmd->add_option("--alibi", run.alibi,
                      "ALiBi slopes .npy: float32 (H) or (B, H) (B = sequences when varlen)");
  run_cmd->add_option("--sinks", run.sinks, "Attention sinks .npy: float32 (H), one logit per head");
  run_cmd->add_option("--cu-seqlens-q", run.cu_seqlens_q,
                      "Packed varlen batch: int32 (B + 1) query offsets .npy; q, k, v are then "
                      "(total_tokens, H, D)");
  run_cmd->add_option("--cu-seqlens-k", run.cu_seqlens_k, "Packed varlen batch: int32 (B + 1) key offsets .npy");
  run_cmd->add_option("--seqused-k", run.seqused_k,
                      "Packed varlen batch: int32 (B) keys used per sequence .npy (optional)");
  std::string run_scale;
  auto* scale_opt = run_cmd->add_option("--scale", run_scale, "Softmax scale (default 1/sqrt(D))");
  run_cmd->add_option("--backend", run.backend, "Backend name or auto")->default_val("auto");
  run_cmd->add_option("--device", run.device, "auto, cpu or cuda")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  auto* info_cmd = app.add_subcommand(
      "info", "Print the version, the build configuration, every backend with its availability, "
              "the SIMD target cpu_flash runs on and the CUDA devices");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*bench_cmd) {
      const auto parsed = parse_dtype(dtype);
      if (!parsed) throw Error(ErrorKind::dtype, "--dtype must be f32, f16 or bf16, got " + dtype);
      bench.shape.dtype = *parsed;
      if (seqlen > 0) bench.shape.seqlen_q = bench.shape.seqlen_k = seqlen;
      if (bench.shape.heads_kv == 0) bench.shape.heads_kv = bench.shape.heads_q;
      bench_variant.apply_to(bench.shape.window, bench.shape.softcap);
      bench.shape.alibi = bench.values.standard_alibi;
      if (bench_sinks_opt->count() > 0) {
        bench.shape.sinks = true;
        bench.values.sink_logit = cli::parse_sinks(bench_sinks).value;
      }
      if (varlen_opt->count() > 0) {
        const cli::VarlenLengths lengths = cli::parse_varlen(bench_varlen);
        bench.shape.varlen_q = lengths.q;
        bench.shape.varlen_k = lengths.k;
      }
      bench.pass = *cli::parse_pass(bench_pass);
      return cli::run_bench(bench);
    }
    if (*check_cmd) {
      check.pass = *cli::parse_pass(check_pass);
      return cli::run_check(check);
    }
    if (*info_cmd) return cli::run_info();
    run.has_scale = scale_opt->count() > 0;
    if (run.has_scale) run.scale = cli::parse_finite(run_scale, "--scale");
    run_variant.apply_to(run.window, run.softcap);
    return cli::run_run(run);
  } catch (const Error& e) {
    std::fprintf(stderr, "flashtile: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashtile: error: %s\n", e.what());
    return 2;
  }
}
