from kvevents.cli import main

main()
