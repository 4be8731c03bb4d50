from pynsqd.supervisor.cli import main

main()
