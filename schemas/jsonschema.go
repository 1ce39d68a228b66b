package schemas

import (
	"embed"
	"fmt"
	"io/fs"
)

// The JSON Schema documents (draft 2020-12) of the records, one per record
// kind and version. They describe the wire format; ParseEvent is the
// authoritative validator of events (its default policy is what the player
// event document states) and the tests check that both agree.
const (
	PlayerEventSchemaFile = "player_event.v1.schema.json"
	TrackPlaySchemaFile   = "track_play.v1.schema.json"
	RejectionSchemaFile   = "rejection.v1.schema.json"
	DeliverySchemaFile    = "delivery.v1.schema.json"
)

//go:embed *.schema.json
var jsonSchemas embed.FS

// JSONSchemas returns the embedded JSON Schema documents as a read-only file
// system (file names are the *SchemaFile constants).
func JSONSchemas() fs.FS { return jsonSchemas }

// JSONSchema returns a copy of the embedded JSON Schema document named file
// (one of the *SchemaFile constants).
func JSONSchema(file string) ([]byte, error) {
	b, err := jsonSchemas.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("schemas: no JSON Schema %q (accepted: %s, %s, %s, %s): %w",
			file, PlayerEventSchemaFile, TrackPlaySchemaFile, RejectionSchemaFile, DeliverySchemaFile, err)
	}
	return b, nil
}
