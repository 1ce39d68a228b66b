// Command playpipe is the one binary of the playpipe pipeline. Each role
// (sandbox, ingest, consume, report, sink, audit, demo, …) is a subcommand;
// `playpipe help` lists them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/playpipe/playpipe/internal/version"
)

// command is one subcommand. Files of this package register theirs in init.
type command struct {
	name    string
	summary string
	// run parses args (without the subcommand name) and runs the command until
	// ctx ends or the work is done.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("playpipe: duplicate subcommand " + c.name)
	}
	commands[c.name] = c
}

// errUsage marks an error whose message was already printed with usage.
var errUsage = errors.New("usage error")

// usageError is a usage error (exit 2) whose message is not printed yet:
// runMain prints it after "playpipe <command>: ".
type usageError struct{ error }

func (e usageError) Is(target error) bool { return target == errUsage }
func (e usageError) Unwrap() error        { return e.error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "playpipe", version.Version)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "playpipe: unknown command %q; accepted: %s\n", args[0], commandNames())
		return 2
	}
	err := c.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if err != errUsage { // a wrapped usage error carries its own message
			fmt.Fprintf(stderr, "playpipe %s: %v\n", c.name, err)
		}
		return 2
	default:
		var ec exitCoder
		if errors.As(err, &ec) {
			fmt.Fprintf(stderr, "playpipe %s: %v\n", c.name, err)
			return ec.ExitCode()
		}
		fmt.Fprintf(stderr, "playpipe %s: %v\n", c.name, err)
		return 1
	}
}

// exitCoder is an error that chooses the process exit code (audit uses it).
type exitCoder interface {
	error
	ExitCode() int
}

func commandNames() string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "playpipe %s: player events to per-track royalty reports, with an audit ledger.\n\n", version.Version)
	fmt.Fprintln(w, "Usage: playpipe <command> [flags]   (playpipe <command> --help for its flags)")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "version", "print the version")
}

// newFlagSet returns a flag set that reports errors to stderr and returns them
// instead of exiting, named after the subcommand.
func newFlagSet(name string, stderr io.Writer, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("playpipe "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: playpipe %s [flags]\n\n%s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and maps a parse failure to errUsage (the flag
// package has already printed which flag was wrong).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return errUsage
	}
	return nil
}
