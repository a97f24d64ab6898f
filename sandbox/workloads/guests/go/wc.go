// The guest example in Go: counts the lines, words and bytes of /input/input.txt, writes them to
// /output/summary.txt and prints one line (the same task and output as every language in
// docs/guests.md). Built with GOOS=wasip1 GOARCH=wasm; only the standard library.
package main

import (
	"fmt"
	"os"
)

func main() {
	text, err := os.ReadFile("/input/input.txt")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var lines, words int
	inword := false
	for _, c := range text {
		if c == '\n' {
			lines++
		}
		if c == ' ' || (c >= '\t' && c <= '\r') {
			inword = false
		} else if !inword {
			inword = true
			words++
		}
	}
	summary := fmt.Sprintf("lines %d\nwords %d\nbytes %d\n", lines, words, len(text))
	if err := os.WriteFile("/output/summary.txt", []byte(summary), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("go: %d lines, %d words, %d bytes\n", lines, words, len(text))
}
