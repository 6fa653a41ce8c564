// Package tiltfilecheck evaluates the project's Tiltfile with a Starlark interpreter.
//
// Tilt itself cannot be built from the Go module proxy this project builds its tools from (the proxy refuses
// github.com/tilt-dev/tilt), so `tilt alpha tiltfile-result` cannot run in tests. This package runs the
// Tiltfile's Starlark with the part of Tilt's API it uses, declared with Tilt's parameter names, and records
// what it asks for. Unknown functions, misspelt or unknown keyword arguments and Starlark errors fail as they
// would in Tilt; `helm()` runs the real helm. It checks the Tiltfile's own logic, not Tilt.
package tiltfilecheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"
)

// LocalResource is one local_resource call.
type LocalResource struct {
	Name, Cmd, ServeCmd string
	Deps, ResourceDeps  []string
	ServeEnv, Env       map[string]string
	ReadinessProbe      starlark.Value
	Links               []string
}

// CustomBuild is one custom_build call.
type CustomBuild struct {
	Ref, Command     string
	Deps             []string
	SkipsLocalDocker bool
}

// K8sResource is one k8s_resource call.
type K8sResource struct {
	Workload     string
	PortForwards []string
}

// Result is everything the Tiltfile asked Tilt for.
type Result struct {
	LocalResources []LocalResource
	CustomBuilds   []CustomBuild
	K8sYAML        []string
	K8sResources   []K8sResource
	Env            map[string]string
}

// Evaluate runs the Tiltfile in dir (the repository root) with Tilt's config args (e.g. "--mode=cluster").
func Evaluate(dir string, args []string, helm string) (*Result, error) {
	r := &Result{Env: map[string]string{"PATH": os.Getenv("PATH")}}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	flags := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			return nil, fmt.Errorf("config arg %q is not --key=value", a)
		}
		flags[k] = v
	}
	defined := map[string]bool{}

	builtin := func(name string, fn func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error)) *starlark.Builtin {
		return starlark.NewBuiltin(name, fn)
	}
	config := starlarkstruct.FromStringDict(starlark.String("config"), starlark.StringDict{
		"define_string": builtin("config.define_string", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var name, usage string
			var isArgs bool
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "name", &name, "args?", &isArgs, "usage?", &usage); err != nil {
				return nil, err
			}
			defined[name] = true
			return starlark.None, nil
		}),
		"parse": builtin("config.parse", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			d := starlark.NewDict(len(flags))
			for k, v := range flags {
				if !defined[k] {
					return nil, fmt.Errorf("config.parse: unknown setting %q", k)
				}
				if err := d.SetKey(starlark.String(k), starlark.String(v)); err != nil {
					return nil, err
				}
			}
			return d, nil
		}),
	})
	path := starlarkstruct.FromStringDict(starlark.String("os.path"), starlark.StringDict{
		"abspath": builtin("os.path.abspath", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var p string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "path", &p); err != nil {
				return nil, err
			}
			return starlark.String(abs(p)), nil
		}),
	})
	osModule := starlarkstruct.FromStringDict(starlark.String("os"), starlark.StringDict{
		"path": path,
		"getenv": builtin("os.getenv", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var key string
			var def starlark.Value = starlark.None
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "key", &key, "default?", &def); err != nil {
				return nil, err
			}
			if v, ok := r.Env[key]; ok {
				return starlark.String(v), nil
			}
			return def, nil
		}),
		"putenv": builtin("os.putenv", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var key, value string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "key", &key, "value", &value); err != nil {
				return nil, err
			}
			r.Env[key] = value
			return starlark.None, nil
		}),
	})

	predeclared := starlark.StringDict{
		"config": config,
		"os":     osModule,
		"fail": builtin("fail", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var msg string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "msg", &msg); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("fail: %s", msg)
		}),
		"allow_k8s_contexts": builtin("allow_k8s_contexts", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var contexts starlark.Value
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "contexts", &contexts); err != nil {
				return nil, err
			}
			return starlark.None, nil
		}),
		"local_resource": builtin("local_resource", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var lr LocalResource
			var cmd, serveCmd, deps, resourceDeps, links, labels, ignore, tags starlark.Value = starlark.None, starlark.None, starlark.None, starlark.None, starlark.None, starlark.None, starlark.None, starlark.None
			var env, serveEnv *starlark.Dict
			var probe, triggerMode, autoInit, allowParallel, dirV, serveDir, cmdBat, serveCmdBat starlark.Value
			if err := starlark.UnpackArgs(b.Name(), args, kwargs,
				"name", &lr.Name, "cmd?", &cmd, "deps?", &deps, "trigger_mode?", &triggerMode,
				"resource_deps?", &resourceDeps, "ignore?", &ignore, "auto_init?", &autoInit,
				"serve_cmd?", &serveCmd, "cmd_bat?", &cmdBat, "serve_cmd_bat?", &serveCmdBat,
				"allow_parallel?", &allowParallel, "links?", &links, "tags?", &tags, "env?", &env,
				"serve_env?", &serveEnv, "readiness_probe?", &probe, "dir?", &dirV, "serve_dir?", &serveDir,
				"labels?", &labels); err != nil {
				return nil, err
			}
			var err error
			if lr.Cmd, err = command(cmd); err != nil {
				return nil, fmt.Errorf("%s cmd: %w", lr.Name, err)
			}
			if lr.ServeCmd, err = command(serveCmd); err != nil {
				return nil, fmt.Errorf("%s serve_cmd: %w", lr.Name, err)
			}
			if lr.Deps, err = strings_(deps); err != nil {
				return nil, err
			}
			if lr.ResourceDeps, err = strings_(resourceDeps); err != nil {
				return nil, err
			}
			if lr.Links, err = strings_(links); err != nil {
				return nil, err
			}
			if lr.Env, err = dict(env); err != nil {
				return nil, err
			}
			if lr.ServeEnv, err = dict(serveEnv); err != nil {
				return nil, err
			}
			lr.ReadinessProbe = probe
			r.LocalResources = append(r.LocalResources, lr)
			return starlark.None, nil
		}),
		"probe": builtin("probe", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var initial, timeout, period, success, failure int
			var execA, httpGet, tcp starlark.Value
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "initial_delay_secs?", &initial, "timeout_secs?", &timeout,
				"period_secs?", &period, "success_threshold?", &success, "failure_threshold?", &failure,
				"exec?", &execA, "http_get?", &httpGet, "tcp_socket?", &tcp); err != nil {
				return nil, err
			}
			return starlarkstruct.FromStringDict(starlark.String("probe"), starlark.StringDict{"http_get": orNone(httpGet)}), nil
		}),
		"http_get_action": builtin("http_get_action", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var port int
			var host, scheme, p string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "port", &port, "host?", &host, "scheme?", &scheme, "path?", &p); err != nil {
				return nil, err
			}
			return starlark.String(fmt.Sprintf("http://%s:%d%s", host, port, p)), nil
		}),
		"link": builtin("link", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var url, name string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "url", &url, "name?", &name); err != nil {
				return nil, err
			}
			return starlark.String(url), nil
		}),
		"custom_build": builtin("custom_build", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var cb CustomBuild
			var cmd, deps starlark.Value
			var tag, commandBat, outputsRef, dirV string
			var disablePush, matchEnv bool
			var liveUpdate, ignore, entrypoint, containerArgs, imageDeps starlark.Value
			var env *starlark.Dict
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "ref", &cb.Ref, "command", &cmd, "deps", &deps,
				"tag?", &tag, "disable_push?", &disablePush, "skips_local_docker?", &cb.SkipsLocalDocker,
				"live_update?", &liveUpdate, "match_in_env_vars?", &matchEnv, "ignore?", &ignore,
				"entrypoint?", &entrypoint, "command_bat?", &commandBat, "outputs_image_ref_to?", &outputsRef,
				"container_args?", &containerArgs, "image_deps?", &imageDeps, "dir?", &dirV, "env?", &env); err != nil {
				return nil, err
			}
			var err error
			if cb.Command, err = command(cmd); err != nil {
				return nil, err
			}
			if cb.Deps, err = strings_(deps); err != nil {
				return nil, err
			}
			r.CustomBuilds = append(r.CustomBuilds, cb)
			return starlark.None, nil
		}),
		"blob": builtin("blob", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var s string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "contents", &s); err != nil {
				return nil, err
			}
			return starlark.String(s), nil
		}),
		"helm": builtin("helm", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var chart, name, namespace, kubeVersion string
			var values, set starlark.Value
			var skipCRDs bool
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "paths", &chart, "name?", &name, "namespace?", &namespace,
				"values?", &values, "set?", &set, "kube_version?", &kubeVersion, "skip_crds?", &skipCRDs); err != nil {
				return nil, err
			}
			argv := []string{"template", name, abs(chart), "--namespace", namespace, "--kube-version", "1.37.1"}
			if !skipCRDs {
				argv = append(argv, "--include-crds")
			}
			sets, err := strings_(set)
			if err != nil {
				return nil, err
			}
			for _, s := range sets {
				argv = append(argv, "--set", s)
			}
			out, err := exec.Command(helm, argv...).Output()
			if err != nil {
				return nil, fmt.Errorf("helm %s: %w", strings.Join(argv, " "), err)
			}
			return starlark.String(out), nil
		}),
		"k8s_yaml": builtin("k8s_yaml", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var yaml string
			var allowDuplicates bool
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "yaml", &yaml, "allow_duplicates?", &allowDuplicates); err != nil {
				return nil, err
			}
			r.K8sYAML = append(r.K8sYAML, yaml)
			return starlark.None, nil
		}),
		"port_forward": builtin("port_forward", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var local, container int
			var name, linkPath, host string
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "local_port", &local, "container_port?", &container,
				"name?", &name, "link_path?", &linkPath, "host?", &host); err != nil {
				return nil, err
			}
			return starlark.String(fmt.Sprintf("%d:%d", local, container)), nil
		}),
		"k8s_resource": builtin("k8s_resource", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var kr K8sResource
			var newName string
			var forwards, podSelectors, triggerMode, resourceDeps, objects, autoInit, readiness, links, labels, discovery starlark.Value
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "workload?", &kr.Workload, "new_name?", &newName,
				"port_forwards?", &forwards, "extra_pod_selectors?", &podSelectors, "trigger_mode?", &triggerMode,
				"resource_deps?", &resourceDeps, "objects?", &objects, "auto_init?", &autoInit,
				"pod_readiness?", &readiness, "links?", &links, "labels?", &labels, "discovery_strategy?", &discovery); err != nil {
				return nil, err
			}
			var err error
			if kr.PortForwards, err = strings_(forwards); err != nil {
				return nil, err
			}
			r.K8sResources = append(r.K8sResources, kr)
			return starlark.None, nil
		}),
	}

	src, err := os.ReadFile(filepath.Join(dir, "Tiltfile"))
	if err != nil {
		return nil, err
	}
	thread := &starlark.Thread{Name: "Tiltfile"}
	// Tilt's dialect: top-level if/for, while, sets, recursion and global reassignment are allowed.
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	if _, err := starlark.ExecFileOptions(opts, thread, "Tiltfile", src, predeclared); err != nil {
		if evalErr, ok := err.(*starlark.EvalError); ok {
			return nil, fmt.Errorf("%s", evalErr.Backtrace())
		}
		return nil, err
	}
	return r, nil
}

func orNone(v starlark.Value) starlark.Value {
	if v == nil {
		return starlark.None
	}
	return v
}

// command accepts what Tilt accepts for a command: a shell string or a list of argv strings.
func command(v starlark.Value) (string, error) {
	switch c := v.(type) {
	case nil, starlark.NoneType:
		return "", nil
	case starlark.String:
		return string(c), nil
	case *starlark.List:
		parts, err := strings_(c)
		return strings.Join(parts, " "), err
	}
	return "", fmt.Errorf("command must be a string or a list, not %s", v.Type())
}

func strings_(v starlark.Value) ([]string, error) {
	switch l := v.(type) {
	case nil, starlark.NoneType:
		return nil, nil
	case starlark.String:
		return []string{string(l)}, nil
	case *starlark.List:
		out := make([]string, 0, l.Len())
		for i := 0; i < l.Len(); i++ {
			s, ok := starlark.AsString(l.Index(i))
			if !ok {
				return nil, fmt.Errorf("list element %s is not a string", l.Index(i))
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string or a list of strings, not %s", v.Type())
}

func dict(d *starlark.Dict) (map[string]string, error) {
	out := map[string]string{}
	if d == nil {
		return out, nil
	}
	for _, item := range d.Items() {
		k, ok1 := starlark.AsString(item[0])
		v, ok2 := starlark.AsString(item[1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("env entries must be strings: %s", item)
		}
		out[k] = v
	}
	return out, nil
}
