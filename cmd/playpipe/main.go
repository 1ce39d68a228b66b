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
	// hidden leaves the command out of the usage (test and try-out tools).
	hidden bool
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
	if len(args) == 0 {
		// No command is a usage error: the usage goes to stderr, exit 2.
		usage(stderr)
		return 2
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 && args[0] == "help" {
			// `playpipe help <command>` is `playpipe <command> --help`.
			c, ok := commands[args[1]]
			if !ok {
				fmt.Fprintf(stderr, "playpipe help: unknown command %q; accepted: %s\n", args[1], commandNames())
				return 2
			}
			if err := c.run(ctx, []string{"--help"}, stdout, stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(stderr, "playpipe help %s: %v\n", c.name, err)
				return 1
			}
			return 0
		}
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
		if commands[n].hidden {
			continue
		}
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

// hideFlags leaves flags a command registers (through a shared RegisterFlags)
// but does not support out of its --help.
func hideFlags(fs *flag.FlagSet, name, synopsis string, hidden ...string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: playpipe %s [flags]\n\n%s\n\nFlags:\n", name, synopsis)
		shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		shown.SetOutput(fs.Output())
		fs.VisitAll(func(f *flag.Flag) {
			for _, h := range hidden {
				if f.Name == h {
					return
				}
			}
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		})
		shown.PrintDefaults()
	}
}

// parseFlags parses args and maps a parse failure to errUsage. The full
// usage is printed only for -h/--help; a bad flag or value prints the flag
// package's one-line message (which names the flag) and where to look.
func parseFlags(fs *flag.FlagSet, args []string) error {
	full := fs.Usage
	fs.Usage = func() {} // the flag package calls it on every error
	err := fs.Parse(args)
	fs.Usage = full
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			full()
			return err
		}
		fmt.Fprintf(fs.Output(), "see %s --help\n", fs.Name())
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q; see %s --help\n", fs.Name(), fs.Arg(0), fs.Name())
		return errUsage
	}
	return nil
}
