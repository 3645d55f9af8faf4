package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// terminal reports whether w is a terminal; tests set app.tty to say so.
func (a *app) terminal(w io.Writer) bool {
	if a.tty != nil {
		return a.tty(w)
	}
	return isTerminal(w)
}

// progress returns a progress bar of max units (-1: unknown, a spinner)
// on the error stream when that is a terminal; elsewhere it draws nothing,
// so logs and pipes stay clean.
func (a *app) progress(max int64, what, units string) *progressbar.ProgressBar {
	return progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(a.errOut),
		progressbar.OptionSetVisibility(a.terminal(a.errOut)),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(units),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(a.errOut, "\n") }),
	)
}
