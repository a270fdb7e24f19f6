// Builds llama.cpp's llama-bench, llama-quantize and llama-batched-bench, the baseline of
// bench/llamacpp.ts, from the source node-llama-cpp 3.21.1 ships in `llama/gitRelease.bundle`.
// A developer tool: never part of `npm install` or `npm test`. Everything lives in a cache
// outside the repo (TL_LLAMACPP_CACHE, default ~/.cache/tl-engine/llamacpp) and is built once:
// a step whose output is already there is skipped. The compile runs under `nice -n 19` with
// 2 jobs, as the machine's cores are shared.
//
//   bun bench/llamacpp-build.ts        # prints the three executables' paths
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

/** The node-llama-cpp version whose bundled llama.cpp is the baseline (issue 25 pins it). */
export const NODE_LLAMA_CPP_VERSION = "3.21.1";
export const TARGETS = ["llama-bench", "llama-quantize", "llama-batched-bench"] as const;
export type LlamaTool = (typeof TARGETS)[number];

export interface LlamaCppBuild {
  bin: Record<LlamaTool, string>;
  /** What the bundle says it is (node-llama-cpp's llama.cpp.info.json) and its commit. */
  release: string;
  commit: string;
  /** Seconds the compile took when this call built it, else the figure recorded when it was built. */
  buildSeconds: number | null;
  cmakeFlags: string[];
  /** The instruction sets it was built for: native (GGML_NATIVE) or avx2 (LLAMACPP_ISA). */
  isa: string;
}

export function cacheDir(): string {
  return process.env.TL_LLAMACPP_CACHE ?? join(homedir(), ".cache", "tl-engine", "llamacpp");
}

// AMX off: on this machine (a VM whose CPU flags list amx_tile) the AMX path llama.cpp picks for
// Q8_0, Q4_0 and Q4_K_M weights with GGML_NATIVE dies with SIGSEGV in ggml_backend_amx_mul_mat
// (gdb, llama-bench -p 8 -n 4 on the 135M-shape Q8_0 file); F16 never takes it. Explicit -mno-*
// options win over -march=native in GCC whatever their order. TL_LLAMACPP_AMX=1 keeps it.
const NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";
// LLAMACPP_ISA=avx2 builds a second copy (build-avx2/) for AVX2, FMA and F16C only: llama.cpp as
// it runs on the machine issue 25 was measured on (AVX2+FMA, no AVX-512), for a host whose CPU
// has more (AVX-512 and VNNI: 512-bit dot-accumulates the 128-bit WebAssembly kernels cannot use).
const ISA = process.env.LLAMACPP_ISA ?? "native";
if (ISA !== "native" && ISA !== "avx2") throw new Error(`LLAMACPP_ISA: native or avx2, not ${ISA}`);
const ISA_FLAGS =
  ISA === "avx2"
    ? ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF"]
    : ["-DGGML_NATIVE=ON", ...(process.env.TL_LLAMACPP_AMX === "1" ? [] : [`-DCMAKE_C_FLAGS=${NO_AMX}`, `-DCMAKE_CXX_FLAGS=${NO_AMX}`])];
const CMAKE_FLAGS = [
  "-DCMAKE_BUILD_TYPE=Release",
  ...ISA_FLAGS,
  "-DLLAMA_CURL=OFF",
  "-DLLAMA_OPENSSL=OFF",
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
  "-DLLAMA_BUILD_SERVER=OFF",
  "-DLLAMA_BUILD_APP=OFF",
  "-DBUILD_SHARED_LIBS=OFF",
];

function run(cmd: string, args: string[], cwd: string): void {
  const r = spawnSync(cmd, args, { cwd, stdio: ["ignore", "inherit", "inherit"] });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} exited ${r.status}`);
}

function need(tool: string, hint: string): void {
  const r = spawnSync(tool, ["--version"], { stdio: "ignore" });
  if (r.error || r.status !== 0) throw new Error(`${tool} is missing: ${hint}`);
}

/** Installs the pinned package, clones its bundle and builds the three tools, each step only when its output is missing. */
export function ensureLlamaCpp(log: (s: string) => void = (s) => console.error(s)): LlamaCppBuild {
  const root = cacheDir();
  mkdirSync(root, { recursive: true });
  const pkg = join(root, "node_modules", "node-llama-cpp");
  const bundle = join(pkg, "llama", "gitRelease.bundle");
  if (!existsSync(bundle)) {
    log(`llamacpp: installing node-llama-cpp@${NODE_LLAMA_CPP_VERSION} into ${root} (scripts off: only its bundled source is used)`);
    run("npm", ["install", "--prefix", root, `node-llama-cpp@${NODE_LLAMA_CPP_VERSION}`, "--ignore-scripts", "--no-audit", "--no-fund"], root);
  }
  const installed = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")).version;
  if (installed !== NODE_LLAMA_CPP_VERSION) throw new Error(`llamacpp: ${pkg} is ${installed}, not ${NODE_LLAMA_CPP_VERSION}; remove ${root}`);
  const src = join(root, "src");
  if (!existsSync(join(src, "CMakeLists.txt"))) {
    log(`llamacpp: cloning ${bundle}`);
    run("git", ["clone", "-q", bundle, src], root);
  }
  const commit = execFileSync("git", ["rev-parse", "HEAD"], { cwd: src, encoding: "utf8" }).trim();
  const release = JSON.parse(readFileSync(join(pkg, "llama", "llama.cpp.info.json"), "utf8")).tag as string;
  const build = join(src, ISA === "native" ? "build" : `build-${ISA}`);
  const bin = Object.fromEntries(TARGETS.map((t) => [t, join(build, "bin", t)])) as Record<LlamaTool, string>;
  const stamp = join(build, "tl-build.json");
  const built = existsSync(stamp) ? JSON.parse(readFileSync(stamp, "utf8")) : null;
  let buildSeconds: number | null = built?.buildSeconds ?? null;
  // Built with other flags (or by hand): every target again, as the flags change every object.
  const sameFlags = built !== null && JSON.stringify(built.cmakeFlags) === JSON.stringify(CMAKE_FLAGS);
  const missing = TARGETS.filter((t) => !sameFlags || !existsSync(bin[t]));
  if (missing.length > 0) {
    need("cmake", "apt-get update && apt-get install -y cmake");
    need("c++", "apt-get update && apt-get install -y g++");
    log(`llamacpp: building ${missing.join(", ")} (nice -n 19, -j2) from ${release} ${commit.slice(0, 12)}`);
    const t0 = performance.now();
    run("nice", ["-n", "19", "cmake", "-S", src, "-B", build, ...CMAKE_FLAGS], src);
    run("nice", ["-n", "19", "cmake", "--build", build, "-j2", "--target", ...missing], src);
    buildSeconds = (performance.now() - t0) / 1000;
    writeFileSync(stamp, JSON.stringify({ buildSeconds, built: new Date().toISOString(), commit, cmakeFlags: CMAKE_FLAGS, targets: missing }, null, 2));
    log(`llamacpp: built in ${buildSeconds.toFixed(0)} s`);
  }
  return { bin, release, commit, buildSeconds, cmakeFlags: CMAKE_FLAGS, isa: ISA };
}

if (import.meta.main) {
  const b = ensureLlamaCpp();
  console.log(JSON.stringify(b, null, 2));
}
