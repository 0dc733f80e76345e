#!/usr/bin/env python3
"""The Kubernetes manifests (deploy/kubernetes/*.yaml), checked offline, with the Python
reference environment (scripts/requirements-ref.txt: yamllint, kubernetes-validate):

  - yamllint (its default rules, lines up to 120);
  - every pod template, as a v1 PodTemplate, against Kubernetes' own schema (kubernetes-validate,
    --strict: an unknown field is an error), for KUBERNETES_VERSION;
  - the custom resource's fields that tutti relies on (the MPIJob's replica specs and slots, the
    Volcano Job's tasks and plugins), by a schema of this file's own: the operators' CRDs are not
    on a package registry, so their openAPIV3Schema cannot be had offline;
  - the launcher's command line with tutti-launch --dry-run, and the program's after "--" with
    the trainer's --dry-run (from this build), so that the manifests cannot drift from the flags;
  - what ties the pieces together: slots = GPUs a worker, --divides = --batch-size, the
    checkpoint folder on a volume every pod mounts, /dev/shm a memory volume, the preStop hook
    writing the file --preemption-notice watches.
Each check is also run on a broken copy, which it must refuse.

    kubernetes_test.py --manifests deploy/kubernetes --launcher scripts/tutti-launch --trainers build/examples
"""
import argparse
import copy
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.30.0"

# The fields tutti relies on (not the operators' whole CRDs: see above).
POD_TEMPLATE = {"type": "object", "required": ["spec"],
                "properties": {"spec": {"type": "object", "required": ["containers"]}}}
REPLICA = {"type": "object", "required": ["replicas", "template"],
           "properties": {"replicas": {"type": "integer", "minimum": 1}, "template": POD_TEMPLATE,
                          "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]}}}
MPIJOB = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"}, "kind": {"const": "MPIJob"},
        "spec": {"type": "object", "required": ["slotsPerWorker", "mpiReplicaSpecs"], "properties": {
            "slotsPerWorker": {"type": "integer", "minimum": 1},
            "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
            "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
            "runPolicy": {"type": "object", "properties": {
                "cleanPodPolicy": {"enum": ["None", "Running", "All"]}, "backoffLimit": {"type": "integer"}}},
            "mpiReplicaSpecs": {"type": "object", "required": ["Launcher", "Worker"], "additionalProperties": False,
                                "properties": {"Launcher": REPLICA, "Worker": REPLICA}}}}}}
VOLCANO_JOB = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "batch.volcano.sh/v1alpha1"}, "kind": {"const": "Job"},
        "spec": {"type": "object", "required": ["tasks", "plugins"], "properties": {
            "schedulerName": {"const": "volcano"}, "minAvailable": {"type": "integer", "minimum": 1},
            "plugins": {"type": "object", "required": ["ssh", "svc"]},
            "tasks": {"type": "array", "minItems": 2, "items": {
                "type": "object", "required": ["name", "replicas", "template"],
                "properties": {"name": {"type": "string"}, "replicas": {"type": "integer", "minimum": 1},
                               "template": POD_TEMPLATE}}}}}}}


def pod_templates(doc):
    """{role: pod template} of an MPIJob or a Volcano Job."""
    if doc["kind"] == "MPIJob":
        return {role.lower(): spec["template"] for role, spec in doc["spec"]["mpiReplicaSpecs"].items()}
    return {task["name"]: task["template"] for task in doc["spec"]["tasks"]}


def option(args, name):
    return args[args.index(name) + 1] if name in args else None


def problems(path, doc):
    """Everything wrong with one manifest (an empty list: nothing)."""
    found = []
    try:
        jsonschema.validate(doc, MPIJOB if doc.get("kind") == "MPIJob" else VOLCANO_JOB)
    except jsonschema.ValidationError as e:
        return ["%s: %s at %s" % (path, e.message, "/".join(str(p) for p in e.absolute_path))]
    templates = pod_templates(doc)
    for role, template in templates.items():
        resource = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role}, "template": template}
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            found.append("%s: the %s pod template: %s at %s" % (path, role, e.message,
                                                                 ".".join(str(p) for p in e.path)))
    if found or set(templates) != {"launcher", "worker"}:
        return found or ["%s: pod templates %s, not launcher and worker" % (path, sorted(templates))]
    launcher = templates["launcher"]["spec"]["containers"][0]
    worker_pod = templates["worker"]["spec"]
    worker = worker_pod["containers"][0]
    command = launcher.get("command", [])
    if command[:1] != ["tutti-launch"] or "--" not in command:
        return found + ["%s: the launcher does not run tutti-launch ... -- PROGRAM: %s" % (path, command)]
    split = command.index("--")
    launch_args, program = command[1:split], command[split + 1:]
    p = subprocess.run([sys.executable, ARGS.launcher, *launch_args, "--dry-run", "--", *program],
                       capture_output=True, text=True)
    if p.returncode != 0:
        found.append("%s: tutti-launch refuses the launcher's command line: %s" % (path, p.stderr.strip()[-300:]))
    trainer = os.path.join(ARGS.trainers, os.path.basename(program[0]), os.path.basename(program[0]))
    if not os.path.exists(trainer):
        trainer = os.path.join(ARGS.trainers, os.path.basename(program[0]))
    p = subprocess.run([trainer, *program[1:], "--dry-run"], capture_output=True, text=True)
    if p.returncode != 0 or "the command line is valid" not in p.stdout:
        found.append("%s: %s refuses the manifest's command line (exit %d): %s" % (
            path, os.path.basename(trainer), p.returncode, (p.stdout + p.stderr).strip()[-300:]))
    # What ties the pieces together.
    gpus = int(worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    slots = doc["spec"]["slotsPerWorker"] if doc["kind"] == "MPIJob" else int(option(launch_args, "--slots") or 1)
    if slots != gpus:
        found.append("%s: %d slots a worker for %d GPUs" % (path, slots, gpus))
    if option(launch_args, "--divides") != option(program, "--batch-size"):
        found.append("%s: --divides %s is not the --batch-size %s" % (
            path, option(launch_args, "--divides"), option(program, "--batch-size")))
    ckpt = option(program, "--checkpoint-dir") or ""
    for role, template in templates.items():
        mounts = [m["mountPath"] for c in template["spec"]["containers"] for m in c.get("volumeMounts", [])]
        if not any(ckpt == m or ckpt.startswith(m.rstrip("/") + "/") for m in mounts):
            found.append("%s: the %s pod does not mount the checkpoint folder %s" % (path, role, ckpt))
    shm = [m["name"] for m in worker.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    volumes = {v["name"]: v for v in worker_pod.get("volumes", [])}
    if not shm or volumes.get(shm[0], {}).get("emptyDir", {}).get("medium") != "Memory":
        found.append("%s: the worker's /dev/shm is not a memory volume (the snapshots live there)" % path)
    notice = option(program, "--preemption-notice") or ""
    hook = " ".join(worker.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
    if not notice.startswith("file:") or "touch " + notice[len("file:"):] not in hook:
        found.append("%s: the worker's preStop hook does not write the notice %s (%s)" % (path, notice, hook))
    return found


def broken(doc):
    """Copies of doc, each with one mistake a check must find: (what, copy)."""
    copies = []
    d = copy.deepcopy(doc)
    pod = pod_templates(d)["worker"]["spec"]["containers"][0]
    pod["volumeMounts"][0]["mountPth"] = pod["volumeMounts"][0].pop("mountPath")
    copies.append(("a misspelled field in a pod template", d))
    d = copy.deepcopy(doc)
    pod_templates(d)["launcher"]["spec"]["containers"][0]["command"].append("--no-such-flag")
    copies.append(("a flag the trainer does not know", d))
    d = copy.deepcopy(doc)
    pod_templates(d)["worker"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] = "sleep 100"
    copies.append(("a preStop hook that writes no notice", d))
    d = copy.deepcopy(doc)
    d["spec"].pop("mpiReplicaSpecs" if d["kind"] == "MPIJob" else "tasks")
    copies.append(("the custom resource without its pods", d))
    return copies


def main():
    failures = []
    files = sorted(f for f in os.listdir(ARGS.manifests) if f.endswith(".yaml"))
    if len(files) < 2:
        failures.append("expected the MPIJob and the Volcano Job in %s, found %s" % (ARGS.manifests, files))
    for name in files:
        path = os.path.join(ARGS.manifests, name)
        lint = subprocess.run([sys.executable, "-m", "yamllint", "-s", "-d",
                               "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}", path],
                              capture_output=True, text=True)
        if lint.returncode != 0:
            failures.append("yamllint %s:\n%s" % (path, lint.stdout + lint.stderr))
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        if len(docs) != 1:
            failures.append("%s: %d documents, expected one" % (path, len(docs)))
            continue
        found = problems(path, docs[0])
        print("%s (%s): %s" % (name, docs[0]["kind"], "; ".join(found) if found else "valid"))
        failures += found
        for what, copy_ in broken(docs[0]):
            if not problems(path, copy_):
                failures.append("%s: %s was not found" % (path, what))
            else:
                print("  refused, as it must be: %s" % what)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifests", required=True, help="deploy/kubernetes")
    parser.add_argument("--launcher", required=True, help="scripts/tutti-launch")
    parser.add_argument("--trainers", required=True, help="the build's examples/ folder")
    ARGS = parser.parse_args()
    sys.exit(main())
