// Package deploy holds no code: it is the home of the deployment files
// (Dockerfile, k8s/, grafana/, prometheus/, the collector's configuration)
// and of the tests that check them and docker-compose.yml against the real
// binary:
//
//   - compose_test.go loads docker-compose.yml with compose-go (the loader
//     Docker Compose uses) and checks every playpipe service's environment
//     against the names its role accepts, its health check, its published
//     ports, its depends_on order and its secrets;
//   - k8s_test.go builds deploy/k8s with kustomize, decodes every object
//     strictly into its k8s.io/api type and checks probes, selectors,
//     secrets, resources and the per-pod Kafka identities;
//   - dashboard_test.go runs every query of the Grafana dashboard against a
//     ledger created by analytics.Migrate on a local ClickHouse.
//
// The accepted environment of a role is read from the built binary's
// `playpipe <role> --help` (every PLAYPIPE_* name it mentions), never from a
// list kept here, so a flag added to a role is accepted by the checks at once
// and a misspelt name in a deployment file fails them.
//
// deploy/ is a Go module of its own (go.mod, requiring playpipe through a
// replace directive to the folder above), and so is deploy/healthcheck (the
// image's health check, the standard library only): k8s.io/api, kustomize
// and compose-go stay out of the module graph of a program that imports
// playpipe's libraries (producer's TestFleetModuleGraph). `make test`, `make
// vet` and the other targets visit both modules besides the root.
package deploy
