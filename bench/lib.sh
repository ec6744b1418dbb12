# lib.sh - sourced by the bench/ scripts: what each prints about the machine
# before it measures, so that a figure can be read against the machine it came
# from and a busy machine is flagged.

# Sets $cpu (the CPU model) and prints the machine line and how busy the CPUs
# were over the second before the runs (from /proc/stat), with a note above 10 %.
bench_machine() {
    local a b busy
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    echo "machine:  $(nproc) CPUs (nproc), ${cpu:-unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, Linux $(uname -r)"
    a=$(head -n 1 /proc/stat)
    sleep 1
    b=$(head -n 1 /proc/stat)
    busy=$(echo "$a $b" | awk '{for (i = 2; i <= 9; i++) { t0 += $i; t1 += $(i + 11) }
        idle = ($16 + $17) - ($5 + $6); printf "%.0f", 100 * (1 - idle / (t1 - t0))}')
    echo "busy:     ${busy} % of the CPUs busy in the second before the runs"
    if [ "$busy" -gt 10 ]; then
        echo "          NOTE: something else is using the CPUs; these numbers will be low and noisy"
    fi
}
