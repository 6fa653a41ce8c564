package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// auditLog is where kube-apiserver writes its audit log; empty (the default) means no audit log at all, so runs
// that do not ask for one pay nothing for it.
var auditLog = flag.String("audit-log", "",
	"write kube-apiserver's audit log here (JSON lines, Metadata level: who did what to which object, no bodies)")

// auditPolicy records every request at Metadata level: user, verb, API group, resource, subresource, namespace,
// name, response code and the authorizer's decision. RequestReceived is left out so each request is one event
// (two for a watch: when it starts streaming and when it ends).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
`

// auditArgs returns the kube-apiserver flags that turn the audit log on (the policy is written into dir), or
// none without --audit-log.
func auditArgs(dir string) ([]string, error) {
	if *auditLog == "" {
		return nil, nil
	}
	path, err := filepath.Abs(*auditLog)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit policy: %w", err)
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, fmt.Errorf("audit policy: %w", err)
	}
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + path,
		"--audit-log-format=json",
		// Blocking: an event is in the file before its request is answered, so a reader right after a request
		// sees it.
		"--audit-log-mode=blocking",
		// One file: rotation would move earlier events where a reader of this path does not look.
		"--audit-log-maxsize=0",
	}, nil
}
