// The guest example in Zig: counts the lines, words and bytes of /input/input.txt, writes them to
// /output/summary.txt and prints one line (the same task and output as every language in
// docs/guests.md). Zig's std on WASI has no absolute paths: std.fs.cwd() is the first preopen (our
// /input), and /output is reached through its preopen, found by name.
const std = @import("std");

pub fn main() !u8 {
    var arena = std.heap.ArenaAllocator.init(std.heap.page_allocator);
    defer arena.deinit();
    const alloc = arena.allocator();
    const stderr = std.io.getStdErr().writer();

    const preopens = try std.fs.wasi.preopensAlloc(alloc);
    const input_fd = preopens.find("/input") orelse {
        try stderr.print("no /input preopen\n", .{});
        return 1;
    };
    const output_fd = preopens.find("/output") orelse {
        try stderr.print("no /output preopen\n", .{});
        return 1;
    };
    const input = std.fs.Dir{ .fd = input_fd };
    const output = std.fs.Dir{ .fd = output_fd };

    const text = input.readFileAlloc(alloc, "input.txt", 1 << 30) catch |err| {
        try stderr.print("/input/input.txt: {s}\n", .{@errorName(err)});
        return 1;
    };

    var lines: u64 = 0;
    var words: u64 = 0;
    var inword = false;
    for (text) |c| {
        if (c == '\n') lines += 1;
        if (c == ' ' or (c >= '\t' and c <= '\r')) {
            inword = false;
        } else if (!inword) {
            inword = true;
            words += 1;
        }
    }

    var buf: [96]u8 = undefined;
    const summary = try std.fmt.bufPrint(&buf, "lines {d}\nwords {d}\nbytes {d}\n", .{ lines, words, text.len });
    output.writeFile(.{ .sub_path = "summary.txt", .data = summary }) catch |err| {
        try stderr.print("/output/summary.txt: {s}\n", .{@errorName(err)});
        return 1;
    };
    try std.io.getStdOut().writer().print("zig: {d} lines, {d} words, {d} bytes\n", .{ lines, words, text.len });
    return 0;
}
