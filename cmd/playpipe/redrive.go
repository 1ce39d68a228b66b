package main

import (
	"context"
	"io"

	"github.com/playpipe/playpipe/replay"
)

func init() {
	register(command{
		name:    "redrive",
		summary: "re-send reports the partner API rejected (400) after a fix, audited as a replay",
		run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runReplay(ctx, replay.KindRedrive, args, stdout, stderr)
		},
	})
}
