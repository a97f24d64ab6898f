// The guest example in AssemblyScript: counts the lines, words and bytes of /input/input.txt, writes
// them to /output/summary.txt and prints one line (the same task and output as every language in
// docs/guests.md). AssemblyScript's standard library has no files: the WASI shim gives it console
// and process over WASI, and the files are opened here with the shim's preview-1 bindings, each
// relative to its preopen (found by name).
import {
  errno,
  fd,
  fd_close,
  fd_prestat_dir_name,
  fd_prestat_get,
  fd_read,
  fd_write,
  iovec,
  oflags,
  path_open,
  prestat,
  prestat_dir,
  rights,
} from "@assemblyscript/wasi-shim/assembly/bindings/wasi_snapshot_preview1";

const scratch = memory.data(64);

function preopen(name: string): i32 {
  for (let dir: u32 = 3; dir < 64; dir++) {
    if (fd_prestat_get(dir, changetype<prestat>(scratch)) != errno.SUCCESS) return -1;
    const len = <i32>changetype<prestat_dir>(scratch).name_len;
    const buf = new ArrayBuffer(len);
    if (fd_prestat_dir_name(dir, changetype<usize>(buf), len) != errno.SUCCESS) return -1;
    if (String.UTF8.decode(buf) == name) return <i32>dir;
  }
  return -1;
}

function open(dir: i32, path: string, flags: u16, rightsBase: u64): i32 {
  const name = String.UTF8.encode(path);
  const out = scratch + 32;
  const err = path_open(
    <fd>dir, 0, changetype<usize>(name), name.byteLength, flags, rightsBase, 0, 0, out,
  );
  return err == errno.SUCCESS ? <i32>load<u32>(out) : -1;
}

function fail(what: string): void {
  // (the shim's console.error writes "Error: ..." to stdout, not stderr)
  process.stderr.write(what + "\n");
  process.exit(1);
}

function main(): void {
  const input = preopen("/input");
  const output = preopen("/output");
  if (input < 0 || output < 0) return fail("no /input or /output preopen");
  const file = open(input, "input.txt", 0, rights.FD_READ);
  if (file < 0) return fail("/input/input.txt: cannot open");

  let lines: u64 = 0, words: u64 = 0, bytes: u64 = 0;
  let inword = false;
  const chunk = new ArrayBuffer(65536);
  const iov = changetype<iovec>(scratch);
  iov.buf = changetype<usize>(chunk);
  iov.buf_len = chunk.byteLength;
  const nread = scratch + 40;
  while (true) {
    if (fd_read(<fd>file, changetype<usize>(iov), 1, nread) != errno.SUCCESS) {
      return fail("/input/input.txt: cannot read");
    }
    const n = load<u32>(nread);
    if (n == 0) break;
    for (let i: u32 = 0; i < n; i++) {
      const c = load<u8>(changetype<usize>(chunk) + i);
      if (c == 10) lines++;
      if (c == 32 || (c >= 9 && c <= 13)) {
        inword = false;
      } else if (!inword) {
        inword = true;
        words++;
      }
    }
    bytes += n;
  }
  fd_close(<fd>file);

  const summary = String.UTF8.encode(`lines ${lines}\nwords ${words}\nbytes ${bytes}\n`);
  const out = open(output, "summary.txt", oflags.CREAT | oflags.TRUNC, rights.FD_WRITE);
  if (out < 0) return fail("/output/summary.txt: cannot create");
  iov.buf = changetype<usize>(summary);
  iov.buf_len = summary.byteLength;
  const wrote = fd_write(<fd>out, changetype<usize>(iov), 1, nread);
  if (wrote != errno.SUCCESS || load<u32>(nread) != <u32>summary.byteLength) {
    return fail("/output/summary.txt: cannot write");
  }
  fd_close(<fd>out);
  console.log(`assemblyscript: ${lines} lines, ${words} words, ${bytes} bytes`);
}

// The shim's config exports the module's start code as WASI's _start.
main();
