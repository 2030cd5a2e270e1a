"""preflight.yml's output lines with torchfleet's stdout callback against Ansible's default."""
from __future__ import annotations


from bench.harness import lab, lab_down, playbook


def table_lines(out):
    """Lines of the debug messages (the plays' own tables), which both callbacks print alike."""
    count, inside = 0, False
    for line in out.splitlines():
        if line.lstrip().startswith("msg: |"):
            inside, indent = True, len(line) - len(line.lstrip())
            count += 1
            continue
        if inside and (not line.strip() or len(line) - len(line.lstrip()) > indent):
            count += 1
            continue
        inside = False
    return count


def run(args, tmp):
    """Lines preflight.yml prints with Ansible's default stdout callback and with torchfleet's,
    on a lab with one node unreachable (a failure to show in full); besides the plays' tables,
    which both print alike."""
    out = {}
    for n in args.output_sizes:
        the_lab = lab(n)
        try:
            the_lab.unreachable(the_lab.nodes[-1].name)
            row = {"hosts": n}
            for callback in ("default", "torchfleet"):
                _, _, rc, text = playbook("preflight.yml", the_lab.inventory, "-e",
                                          "run_dir=%s/out-%s-%d" % (tmp, callback, n),
                                          ANSIBLE_STDOUT_CALLBACK=callback)
                assert rc != 0 and "UNREACHABLE" in text, text[-3000:]
                lines = len(text.splitlines())
                row[callback] = {"lines": lines, "besides_tables": lines - table_lines(text)}
            out["lab%d" % n] = row
        finally:
            lab_down()
    return out
