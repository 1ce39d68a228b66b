package kafkanode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultVersion is the Apache Kafka release the tests start unless
// PLAYPIPE_KAFKA_VERSION names another: the one docker-compose.yml runs
// (apache/kafka image) and the Makefile's KAFKA_VERSION resolves; a test in
// deploy keeps the three in step.
const DefaultVersion = "4.1.0"

// LastV3 is the last 3.x release, still common on managed services: the
// tests run on it with KAFKA_VERSION=3.9.2 (docs/kafka.md).
const LastV3 = "3.9.2"

// ErrNotInstalled says that the jars of a Kafka release or a Java runtime
// are missing; its message names the command that installs them.
var ErrNotInstalled = errors.New("kafkanode: Apache Kafka is not installed")

// Install is one resolved Apache Kafka release: the folder of its jars.
type Install struct {
	Version string
	Libs    string // folder of kafka_2.13-<version>.jar and its runtime dependencies
	Java    string // the java binary
}

// Major is the release's major version (3 or 4).
func (in Install) Major() int {
	if strings.HasPrefix(in.Version, "3.") {
		return 3
	}
	return 4
}

// FindInstall locates the jars of version (DefaultVersion when empty) in
// .playpipe/kafka/<version>/libs of the module root above the working
// directory (where `make kafka` puts them), and a java binary ($JAVA_HOME/bin
// or PATH). Missing either is ErrNotInstalled, wrapped with what to run.
func FindInstall(version string) (Install, error) {
	if version == "" {
		version = DefaultVersion
	}
	in := Install{Version: version}
	java, err := findJava()
	if err != nil {
		return in, err
	}
	in.Java = java
	root, err := moduleRoot()
	if err != nil {
		return in, err
	}
	in.Libs = filepath.Join(root, ".playpipe", "kafka", version, "libs")
	jar := filepath.Join(in.Libs, "kafka_2.13-"+version+".jar")
	if _, err := os.Stat(jar); err != nil {
		return in, fmt.Errorf("%w: %s is missing: run `make kafka KAFKA_VERSION=%s` (Maven resolves org.apache.kafka:kafka_2.13:%s from deploy/kafka/pom.xml)", ErrNotInstalled, jar, version, version)
	}
	return in, nil
}

func findJava() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		p := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("%w: no java on PATH or in $JAVA_HOME/bin: install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)", ErrNotInstalled)
	}
	return p, nil
}

// moduleRoot is the nearest folder at or above the working directory that
// holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kafkanode: working directory: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("%w: no go.mod at or above %s to find .playpipe/kafka in", ErrNotInstalled, dir)
		}
	}
}
