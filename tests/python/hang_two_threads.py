# A worker that hangs: it beats its heartbeat (CTRUN_HEARTBEAT_FILE, --worker_timeout) for a
# moment, then a helper thread sleeps and the main thread waits on an event nobody sets. Under
# ctrun --worker_timeout the agent must catch both threads' Python stacks (faulthandler).
import os
import threading
import time


def sleeper_thread_body():
    time.sleep(300)


def main_thread_blocked(event):
    event.wait(300)


def main():
    beat = os.environ["CTRUN_HEARTBEAT_FILE"]
    threading.Thread(target=sleeper_thread_body, name="sleeper", daemon=True).start()
    for _ in range(10):
        os.utime(beat)
        time.sleep(0.05)
    print("hanging now", flush=True)
    main_thread_blocked(threading.Event())


if __name__ == "__main__":
    main()
