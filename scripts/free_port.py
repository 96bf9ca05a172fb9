"""Print the first TCP port free on this host, trying START, START+1, ... and wrapping within [LOW, HIGH).

    python3 scripts/free_port.py START LOW HIGH

Used by slurm_multinode.sbatch for the rendezvous port. Standard library only: it runs before any environment of
the project is needed. A port is free when a socket can bind it on every address (a listener on any address of
the host holds it)."""
import socket
import sys


def is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def first_free_port(start: int, low: int, high: int) -> int | None:
    span = high - low
    for offset in range(span):
        port = low + (start - low + offset) % span
        if is_free(port):
            return port
    return None


def main() -> None:
    start, low, high = (int(arg) for arg in sys.argv[1:4])
    port = first_free_port(start, low, high)
    if port is None:
        sys.exit(f"error: no free TCP port in {low}-{high - 1} on {socket.gethostname()} for the rendezvous: "
                 f"free one, or launch torchrun by hand with --rdzv-endpoint=HOST:PORT")
    print(port)


if __name__ == "__main__":
    main()
