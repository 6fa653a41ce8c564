package tiltfilecheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var services = []string{"provider-service", "peerpod-ctrl", "peer-pod-config-ctrl"}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func helm(t *testing.T) string {
	t.Helper()
	h := filepath.Join(root(t), ".tools/bin/helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("%s missing: run make helm", h)
	}
	return h
}

func TestLocalModeRunsTheControlPlaneAndTheThreeServices(t *testing.T) {
	dir := root(t)
	r, err := Evaluate(dir, nil, helm(t))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]LocalResource{}
	for _, lr := range r.LocalResources {
		names[lr.Name] = lr
	}
	var got []string
	for n := range names {
		got = append(got, n)
	}
	sort.Strings(got)
	want := []string{"controlplane", "crds", "namespace", "peer-pod-config-ctrl", "peerpod-ctrl", "provider-service"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("local resources %v, want %v", got, want)
	}
	if len(r.K8sYAML)+len(r.CustomBuilds) != 0 {
		t.Fatalf("local mode must not need images or a cluster: %+v", r)
	}
	if !strings.HasPrefix(r.Env["PATH"], filepath.Join(dir, ".tools/bin")+":") {
		t.Errorf("PATH does not start with .tools/bin: %s", r.Env["PATH"])
	}
	for _, lr := range r.LocalResources {
		for _, dep := range lr.ResourceDeps {
			if _, ok := names[dep]; !ok {
				t.Errorf("%s depends on unknown resource %s", lr.Name, dep)
			}
		}
		for _, dep := range lr.Deps {
			if _, err := os.Stat(filepath.Join(dir, dep)); err != nil {
				t.Errorf("%s watches %s, which does not exist", lr.Name, dep)
			}
		}
	}
	admin := regexp.MustCompile(`--admin-listen 127\.0\.0\.1:(\d+)`)
	for _, s := range services {
		lr := names[s]
		if lr.Cmd != "cargo build --bin "+s+" -p "+s {
			t.Errorf("%s builds with %q", s, lr.Cmd)
		}
		if lr.ServeEnv["KUBECONFIG"] != filepath.Join(dir, ".testenv/kubeconfig") {
			t.Errorf("%s KUBECONFIG %q", s, lr.ServeEnv["KUBECONFIG"])
		}
		m := admin.FindStringSubmatch(lr.ServeCmd)
		if m == nil {
			t.Fatalf("%s serve_cmd has no admin address: %s", s, lr.ServeCmd)
		}
		if probe := lr.ReadinessProbe.String(); !strings.Contains(probe, "127.0.0.1:"+m[1]+"/readyz") {
			t.Errorf("%s readiness probe %s is not its /readyz on %s", s, probe, m[1])
		}
		// The flags the Tiltfile passes must be flags the binary knows: clap refuses unknown ones before
		// it reaches --help.
		fields := strings.Fields(lr.ServeCmd)
		bin := filepath.Join(dir, fields[0])
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s not built (cargo build --bins): %v", bin, err)
		}
		out, err := exec.Command(bin, append(fields[1:], "--help")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s refuses the Tiltfile's flags: %v\n%s", s, err, out)
		}
	}
}

func TestClusterModeBuildsThreeImagesAndDeploysTheChart(t *testing.T) {
	dir := root(t)
	r, err := Evaluate(dir, []string{"--mode=cluster", "--namespace=pp-dev"}, helm(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.LocalResources) != 0 {
		t.Fatalf("cluster mode runs no local processes: %+v", r.LocalResources)
	}
	yaml := strings.Join(r.K8sYAML, "\n---\n")
	if !strings.Contains(yaml, "kind: Namespace\nmetadata:\n  name: pp-dev") {
		t.Errorf("no Namespace pp-dev")
	}
	if len(r.CustomBuilds) != len(services) {
		t.Fatalf("custom builds: %+v", r.CustomBuilds)
	}
	for i, s := range services {
		cb := r.CustomBuilds[i]
		if cb.Ref != "peerpods/"+s || !cb.SkipsLocalDocker {
			t.Errorf("custom_build %+v", cb)
		}
		// Tilt replaces the chart's image by the ref it built; the chart must use exactly that repository.
		if !strings.Contains(yaml, `image: "peerpods/`+s+`:`) {
			t.Errorf("the chart does not use image peerpods/%s", s)
		}
		// The shell command has make build and push exactly Tilt's EXPECTED_REF, plain HTTP only on localhost.
		cmd := strings.ReplaceAll(cb.Command, "make ", "echo make ")
		for ref, tls := range map[string]string{
			"registry.test:5000/peerpods/" + s + ":tilt-0123": "true",
			"localhost:5000/peerpods_" + s + ":tilt-0123":     "false",
		} {
			run := exec.Command("bash", "-c", cmd)
			run.Env = append(os.Environ(), "EXPECTED_REF="+ref)
			out, err := run.CombinedOutput()
			want := "make docker-build docker-push IMAGES=" + s + " IMAGE_REF=" + ref + " PUSH_TLS_VERIFY=" + tls
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Errorf("%s build command gives %q (%v), want %q", s, out, err, want)
			}
		}
		wl := r.K8sResources[i]
		if wl.Workload != "peerpods-"+s || !strings.Contains(yaml, "kind: Deployment\nmetadata:\n  name: peerpods-"+s+"\n") {
			t.Errorf("k8s_resource %q is not a Deployment of the chart", wl.Workload)
		}
		if len(wl.PortForwards) != 1 {
			t.Errorf("%s port forwards %v", s, wl.PortForwards)
		}
	}
}

func TestUnknownModeFails(t *testing.T) {
	_, err := Evaluate(root(t), []string{"--mode=docker"}, helm(t))
	if err == nil || !strings.Contains(err.Error(), "--mode must be local or cluster") {
		t.Fatalf("err = %v", err)
	}
}
