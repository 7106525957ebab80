// check.mjs — the named checks of the Node test clients (sdk.mjs,
// native.mjs): check(name, fn) runs one async check; a failure is printed
// with its stack and makes the process exit non-zero; counts.passed counts
// the ones that held.
export const counts = { passed: 0 };
export async function check(name, fn) {
  try {
    await fn();
    counts.passed++;
  } catch (e) {
    console.error(`FAIL ${name}: ${e.stack || e}`);
    process.exitCode = 1;
  }
}
