package main

import "github.com/playpipe/playpipe/replay"

func init() {
	register(replayCommand(replay.KindRedrive, "re-send reports the partner API rejected (400) after a fix, audited as a replay"))
}
